"""The SFT trainer's configuration (``config/sft_trainer.yaml``) as typed dataclasses.

``python -m verl.trainer.fsdp_sft_trainer key=value ...`` composes the YAML, merges the overrides and
types the result with :func:`verl.utils.config.to_typed` (unknown keys and wrong types fail at start,
naming the key). The model section has the loading keys of the RL actor's
:class:`~verl.utils.model_config.ModelConfig`, so SFT's output and settings carry over to
``actor_rollout_ref.model``. See docs/sft.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from verl.envs.base import EnvConfig
from verl.utils.model_config import ModelSource


@dataclass(frozen=True)
class SFTDataConfig:
    """Chat examples and how they are batched (``data``)."""

    train_files: Any = "~/data/search_r1_sft/train.jsonl"
    """.parquet or .jsonl file(s); a list is allowed"""
    val_files: Any = None
    """validation loss every `trainer.test_freq` steps (`null`: none)"""
    messages_key: str = "messages"
    """rows with a chat list, or ..."""
    prompt_key: str = "prompt"
    """... a prompt (string or chat list) ..."""
    response_key: str = "response"
    """... plus a response string"""
    max_length: int = 1024
    """tokens per example"""
    truncation: str = "right"
    """`right`, `drop` or `error` for a longer example"""
    train_batch_size: int = 32
    """examples per optimizer step, all ranks together"""
    micro_batch_size_per_gpu: int = 4
    """examples per micro-batch when `use_dynamic_bsz` is false"""
    use_dynamic_bsz: bool = True
    """micro-batches by token budget instead of a fixed row count"""
    max_token_len_per_gpu: int = 4096
    """padded tokens per micro-batch (rows x longest row)"""
    shuffle: bool = True
    """shuffle each epoch (seeded by `trainer.seed`)"""


@dataclass(frozen=True)
class SFTFSDPConfig:
    """FSDP2 placement of the fine-tuned model (``model.fsdp_config``)."""

    param_offload: bool = False
    """keep parameters, gradients and the AdamW step on the CPU: FSDP2's CPUOffloadPolicy (the RL
    workers' `offload_policy`; SFT never needs the GPU for anything else between steps, so their
    `param_offload`, which moves the model out between phases, has no use here)"""
    mixed_precision: Optional[str] = None
    """compute dtype on a GPU (`null`: bf16 parameters, fp32 reduction)"""


@dataclass(frozen=True)
class SFTModelConfig(ModelSource):
    """The model to fine-tune (``model``): the loading keys of the RL actor's ``ModelConfig``."""

    path: str = "~/models/SmolLM2-135M-Instruct"
    """base model: a local folder or a hub id"""
    enable_gradient_checkpointing: bool = True
    """activation checkpointing"""
    lora_rank: int = 0
    """> 0 trains LoRA adapters only (peft)"""
    lora_alpha: int = 16
    """LoRA scaling numerator"""
    target_modules: Any = "all-linear"
    """modules given LoRA adapters: `all-linear` or a list, e.g. `[q_proj, k_proj, v_proj, o_proj]`"""
    fsdp_config: SFTFSDPConfig = field(default_factory=SFTFSDPConfig)
    """sharding of the model"""


@dataclass(frozen=True)
class SFTOptimConfig:
    """AdamW, its schedule and gradient clipping (``optim``)."""

    lr: float = 1.0e-5
    """learning rate"""
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW betas"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    warmup_steps_ratio: float = 0.1
    """linear warm-up as a fraction of the run's steps"""
    lr_scheduler: str = "cosine"
    """after warm-up: `cosine` or `constant`"""
    min_lr_ratio: float = 0.0
    """cosine floor as a fraction of `lr`"""
    clip_grad: float = 1.0
    """max gradient norm"""


@dataclass(frozen=True)
class SFTTrainerConfig:
    """Length, checkpoints and logging (``trainer``)."""

    default_local_dir: str = "checkpoints/${.project_name}/${.experiment_name}"
    """checkpoint root: `global_step_N/{actor,huggingface}`"""
    project_name: str = "search_r1_sft"
    """wandb project"""
    experiment_name: str = "sft"
    """run name"""
    total_epochs: int = 1
    """epochs when `total_training_steps` is null"""
    total_training_steps: Optional[int] = None
    """steps to run (wins over epochs)"""
    save_freq: int = -1
    """checkpoint every N steps; -1: once at the end"""
    test_freq: int = -1
    """validation loss every N steps; -1: once at the end (with `data.val_files`)"""
    max_ckpt_to_keep: Optional[int] = None
    """keep at most N checkpoints (`null`: all)"""
    save_optimizer: bool = True
    """`false`: only `huggingface/` (a smaller warm-start cache)"""
    logger: List[str] = field(default_factory=lambda: ["console"])
    """any of `console`, `jsonl`, `tensorboard`, `wandb`"""
    seed: int = 1
    """seed of the data order and the RNGs"""


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning (full or LoRA); its output is a valid ``actor_rollout_ref.model.path``."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    """examples and batching"""
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    """the model"""
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    """the optimizer"""
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    """the loop"""
    env: EnvConfig = field(default_factory=EnvConfig)
    """the environment whose trajectories the examples are: the text it wrote in an assistant turn is not trained on"""
