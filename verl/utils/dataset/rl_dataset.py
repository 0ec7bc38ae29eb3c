"""The RL prompt dataset: parquet or JSONL rows -> chat-templated, left-padded prompt tensors + raw fields.

Rows follow Search-R1's schema (``scripts/data_process/qa_common.py``, checked in ``rl_rows``):
``prompt`` is a list of chat messages (or a string), ``reward_model.ground_truth`` the answers
(``{"target": [...]}``, or a bare string / list, which is wrapped). Each item is

    input_ids, attention_mask, position_ids : (P,) int64, left padded to ``max_prompt_length``
    raw_prompt_ids                          : list[int], the unpadded prompt (engines take these)
    data_source, reward_model, extra_info, index, uid (+ ability, raw_prompt when asked)

Prompts are never cut: one longer than ``max_prompt_length`` is dropped with a logged count
(``filter_overlong_prompts``) or raises naming its row. Masks come from lengths, never from
comparing ids with ``pad_token_id`` (which equals ``eos_token_id`` for SmolLM2 and Qwen base).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from verl.utils.dataset.rl_rows import RowForm, check_extra_info, check_reward_model, read_rows

logger = logging.getLogger(__name__)

DEFAULTS = {"prompt_key": "prompt", "max_prompt_length": 1024, "filter_overlong_prompts": True,
            "return_raw_chat": False, "truncation": "error"}
MAX_REPORTED_ROWS = 5


def _settings(config: Mapping | None, overrides: dict) -> dict:
    """DEFAULTS, then the ``data`` section of ``config`` (or ``config`` itself), then kwargs."""
    settings = dict(DEFAULTS)
    if config is not None:
        section = config["data"] if "data" in config else config
        settings.update({key: section[key] for key in DEFAULTS if key in section})
    settings.update({key: value for key, value in overrides.items() if value is not None})
    if settings["truncation"] != "error":
        raise ValueError(f"data.truncation={settings['truncation']!r} is not supported: cutting a "
                         "prompt removes its question; use filter_overlong_prompts or a larger "
                         "max_prompt_length")
    return settings


def read_parquet_rows(path: str | Path, required: Sequence[str]) -> list[dict]:
    """Rows of one parquet file as Python dicts (nested lists/dicts, no numpy).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a required column is missing (names the file and the key).
    """
    return [row for _, _, row in read_rows(path, required)]


def as_messages(prompt: Any, where: str) -> list[dict]:
    """A prompt field as chat messages; a bare string becomes one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)) and prompt and all(
            isinstance(m, Mapping) and "content" in m for m in prompt):
        return [dict(m) for m in prompt]
    raise ValueError(f"{where}: prompt must be a string or a list of {{'role', 'content'}} "
                     f"messages, got {prompt!r:.200}")


def render_prompt(tokenizer, messages: list[dict]) -> str:
    """Chat template with the assistant header when the tokenizer has one, else the raw text."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
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
        config: optional mapping (the whole config or its ``data`` section) with keys
            ``prompt_key``, ``max_prompt_length``, ``filter_overlong_prompts``, ``return_raw_chat``,
            ``truncation`` (only ``"error"``).
        row_form: another row form to accept (:class:`~verl.utils.dataset.rl_rows.RowForm`; the
            trainer passes FlashRAG's, :data:`search_r1.qa_rows.FLASHRAG_FORM`).
        **overrides: the same keys as keyword arguments (win over ``config``).
    Raises:
        FileNotFoundError / ValueError: missing file or column, malformed row, prompt or
            ``reward_model`` (names file, row or line, and field), an overlong prompt with filtering
            off (names file, row and uid), or no prompt left.
    """

    def __init__(self, parquet_files, tokenizer, config: Mapping | None = None, *,
                 prompt_key: str | None = None, max_prompt_length: int | None = None,
                 filter_overlong_prompts: bool | None = None, return_raw_chat: bool | None = None,
                 truncation: str | None = None, row_form: RowForm | None = None):
        self.row_form = row_form
        self.settings = _settings(config, dict(
            prompt_key=prompt_key, max_prompt_length=max_prompt_length,
            filter_overlong_prompts=filter_overlong_prompts, return_raw_chat=return_raw_chat,
            truncation=truncation))
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
            raise ValueError(f"no prompts left in {files} (max_prompt_length="
                             f"{self.settings['max_prompt_length']})")

    def _load(self, path) -> None:
        key, limit = self.settings["prompt_key"], int(self.settings["max_prompt_length"])
        overlong, num_rows = [], 0
        for where, position, row in read_rows(path, [key, "reward_model"], self.row_form):
            num_rows += 1
            messages = as_messages(row[key], where)
            row["reward_model"] = check_reward_model(row["reward_model"], where)
            row["extra_info"] = check_extra_info(row.get("extra_info"), where)
            ids = self.tokenizer(render_prompt(self.tokenizer, messages),
                                 add_special_tokens=False)["input_ids"]
            uid = row_uid(row, f"{Path(path).stem}-{position}")
            if len(ids) > limit:
                if not self.settings["filter_overlong_prompts"]:
                    raise ValueError(f"{where} (uid {uid}): prompt has {len(ids)} tokens > "
                                     f"data.max_prompt_length={limit}")
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
        out = left_pad(ids, int(self.settings["max_prompt_length"]), self.tokenizer.pad_token_id)
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
        if self.settings["return_raw_chat"]:
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
