"""Settings of the RL prompt data (``data``): files, length budgets, batch sizes, order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class DataConfig:
    """Training and validation prompts and the token budgets of the multi-turn search loop."""

    tokenizer: Optional[str] = None
    """tokenizer path; `null`: `actor_rollout_ref.model.path`"""
    train_files: Any = "data/nq_search/train.parquet"
    """training file(s), a path or a list, in Search-R1's row format"""
    val_files: Any = "data/nq_search/test.parquet"
    """validation file(s); `val/test_score/<data_source>` per source"""
    train_data_num: Optional[int] = None
    """use only the first N training rows (`null`: all)"""
    val_data_num: Optional[int] = None
    """use only the first N validation rows (`null`: all)"""
    prompt_key: str = "prompt"
    """column holding the chat-format prompt"""
    max_prompt_length: int = 4096
    """budget of the whole rolling context (question + earlier turns + observations) given to the engine"""
    max_response_length: int = 500
    """new tokens per generation turn (Search-R1's meaning); the trajectory tensors are
    `max_response_length x (max_turns + 1) + max_obs_length x max_turns` wide"""
    max_start_length: int = 2048
    """max tokens of the initial prompt (longer prompts are dropped with a count, or rejected)"""
    max_obs_length: int = 500
    """max tokens of one `<information>` observation (cut inside, keeping the closing tag)"""
    filter_overlong_prompts: bool = True
    """drop prompts longer than `max_start_length` (logged with a count); `false`: fail naming the row"""
    train_batch_size: int = 512
    """prompts per training step"""
    val_batch_size: int = 256
    """prompts per validation generation batch"""
    return_raw_chat: bool = False
    """keep the raw chat messages on each row (`raw_prompt`)"""
    shuffle_train_dataloader: bool = True
    """shuffle each epoch (seeded by `data.seed + epoch`, resumable)"""
    seed: int = 1
    """seed of the training data order"""
