"""The RL prompt dataset: parquet or JSONL rows -> chat-templated, left-padded prompt tensors + raw fields.

Rows follow Search-R1's schema (``scripts/data_process/qa_common.py``, checked in ``rl_rows``):
``prompt`` is a list of chat messages (or a string), ``reward_model.ground_truth`` the answers
(``{"target": [...]}``, or a bare string / list, which is wrapped). Each item is

    input_ids, attention_mask, position_ids : (P,) int64, left padded to ``data.max_start_length``
    raw_prompt_ids                          : list[int], the unpadded prompt (engines take these)
    data_source, reward_model, extra_info, index, uid (+ ability, raw_prompt when asked)

Prompts are never cut (that would remove the question): one longer than ``data.max_start_length``
is dropped with a logged count (``filter_overlong_prompts``) or raises naming its row. Masks come from lengths, never from
comparing ids with ``pad_token_id`` (which equals ``eos_token_id`` for SmolLM2 and Qwen base).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from verl.utils.dataset.config import DataConfig
from verl.utils.dataset.rl_rows import check_extra_info, check_reward_model, read_rows

logger = logging.getLogger(__name__)

MAX_REPORTED_ROWS = 5




def as_messages(prompt: Any, where: str) -> list[dict]:
    """A prompt field as chat messages; a bare string becomes one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)) and prompt and all(
            isinstance(m, Mapping) and "content" in m for m in prompt):
        return [dict(m) for m in prompt]
    raise ValueError(f"{where}: prompt must be a string or a list of {{'role', 'content'}} "
                     f"messages, got {prompt!r:.200}")


def render_prompt(tokenizer, messages: list[dict], **template_kwargs) -> str:
    """Chat template with the assistant header when the tokenizer has one, else the raw text.

    ``template_kwargs`` go to ``apply_chat_template`` (an environment's ``tools``).
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)
    return "\n".join(m["content"] for m in messages)


def left_pad(ids: Sequence[int], length: int, pad_id: int) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask``, ``position_ids`` of shape (length,), padding on the left.

    ``position_ids`` = cumsum(attention_mask) - 1, clipped at 0 (0 on the padding).
    """
    num_pad = length - len(ids)
    assert num_pad >= 0, "callers filter overlong prompts first"
    input_ids = torch.tensor([pad_id] * num_pad + list(ids), dtype=torch.long)
    attention_mask = torch.cat([torch.zeros(num_pad, dtype=torch.long),
                                torch.ones(len(ids), dtype=torch.long)])
    position_ids = (attention_mask.cumsum(0) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


def row_uid(row: dict, fallback: str) -> str:
    """``extra_info.uid`` (written by the data scripts, unique across sources) or ``fallback``."""
    extra = row.get("extra_info") or {}
    return str(extra["uid"]) if extra.get("uid") is not None else fallback


class RLHFDataset(torch.utils.data.Dataset):
    """Prompts of one or more parquet / JSONL files, tokenized once at construction.

    Args:
        parquet_files: a path or a list of paths, ``.parquet`` or ``.jsonl`` (rows are concatenated
            in order).
        tokenizer: a Hugging Face tokenizer; its ``pad_token`` is set to ``eos_token`` if missing.
        data: the ``data`` section (``prompt_key``, ``max_start_length``, ``filter_overlong_prompts``,
            ``return_raw_chat``).
        env: the run's environment (``verl.envs.Environment``), or None: it may accept another
            row form (``row_form``, e.g. FlashRAG's QA rows), make a row's chat messages
            (``prompt_messages``) and add chat-template arguments (``chat_template_kwargs``).
    Raises:
        FileNotFoundError / ValueError: missing file or column, malformed row, prompt or
            ``reward_model`` (names file, row or line, and field), an overlong prompt with filtering
            off (names file, row and uid), or no prompt left.
    """

    def __init__(self, parquet_files, tokenizer, data: DataConfig | None = None, env=None):
        self.data = data or DataConfig()
        self.env = env
        self.tokenizer = tokenizer
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
            logger.info("tokenizer has no pad token; using eos %r", tokenizer.eos_token)
        files = [parquet_files] if isinstance(parquet_files, (str, Path)) else list(parquet_files)
        self.rows: list[dict] = []
        self.prompt_ids: list[np.ndarray] = []
        self.num_filtered = 0
        for path in files:
            self._load(path)
        if not self.rows:
            raise ValueError(f"no prompts left in {files} (data.max_start_length={self.data.max_start_length})")

    def _load(self, path) -> None:
        key, limit, env = self.data.prompt_key, self.data.max_start_length, self.env
        template_kwargs = env.chat_template_kwargs() if env is not None else {}
        overlong, num_rows = [], 0
        for where, position, row in read_rows(path, [key, "reward_model"], env.row_form() if env is not None else None):
            num_rows += 1
            messages = as_messages(row[key], where)
            if env is not None:
                messages = env.prompt_messages(row, messages)
            row["reward_model"] = check_reward_model(row["reward_model"], where)
            row["extra_info"] = check_extra_info(row.get("extra_info"), where)
            ids = self.tokenizer(render_prompt(self.tokenizer, messages, **template_kwargs),
                                 add_special_tokens=False)["input_ids"]
            uid = row_uid(row, f"{Path(path).stem}-{position}")
            if len(ids) > limit:
                if not self.data.filter_overlong_prompts:
                    raise ValueError(f"{where} (uid {uid}): prompt has {len(ids)} tokens > "
                                     f"data.max_start_length={limit}")
                overlong.append(uid)
                continue
            row["_messages"], row["_uid"], row["_position"] = messages, uid, position
            self.rows.append(row)
            self.prompt_ids.append(np.asarray(ids, dtype=np.int64))
        if overlong:
            logger.warning("%s: filtered %d of %d prompts longer than %d tokens (first uids: %s)",
                           path, len(overlong), num_rows, limit, overlong[:MAX_REPORTED_ROWS])
        self.num_filtered += len(overlong)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict:
        row, ids = self.rows[item], self.prompt_ids[item].tolist()
        out = left_pad(ids, self.data.max_start_length, self.tokenizer.pad_token_id)
        extra = row["extra_info"]
        out.update({
            "raw_prompt_ids": ids,
            "data_source": row.get("data_source"),
            "reward_model": row.get("reward_model"),
            "extra_info": extra,
            "index": extra.get("index", row["_position"]),
            "uid": row["_uid"],
        })
        if "ability" in row:
            out["ability"] = row["ability"]
        if self.data.return_raw_chat:
            out["raw_prompt"] = row["_messages"]
        return out


def collate_fn(items: list[dict]) -> dict[str, Any]:
    """Stack tensors to (B, ...); every other field becomes a (B,) numpy object array.

    Object arrays are filled element by element so equal-length lists (e.g. ``raw_prompt_ids``)
    stay one Python list per row instead of becoming a 2-D array.
    """
    out: dict[str, Any] = {}
    for key in items[0]:
        values = [item[key] for item in items]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        else:
            array = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):
                array[i] = value
            out[key] = array
    return out
