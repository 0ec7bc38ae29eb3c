"""Multi-turn SFT data: tokenised segment by segment so the loss mask comes from construction.

A row is either ``{"messages": [{"role", "content"}, ...]}`` or ``{"prompt": ..., "response": str}``
(``prompt`` a string or a list of chat messages, as in the RL parquet). Column names are
configurable.

The loss mask follows the RL rule (docs/architecture.md, ``response_mask``): 1 on tokens the model
itself would generate (assistant text and the end-of-turn token), 0 on everything else -- system and
user turns, chat-template scaffolding, and ``<information>...</information>`` observations inside an
assistant turn. Observations are located in the *source* string by the environment's pattern (the
caller passes it: the environment's ``environment_text``, for the search loop's observations and
invalid-action message), and every piece is tokenised on its own and the
ids concatenated, the way the agent loop appends observation tokens after generated ones.
So masks never depend on decoding ids or on comparing ids with pad/eos.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch.utils.data import Dataset


@dataclass
class Segment:
    """A piece of text and whether the model is trained to produce it."""

    text: str
    trainable: bool


def split_assistant_content(content: str, environment_text: re.Pattern) -> list[Segment]:
    """Split an assistant turn into generated text (trainable) and observations (not trainable).

    ``environment_text``: a compiled pattern with one group matching the text the environment wrote.

    ``"<search> q </search>\\n\\n<information>D</information>\\n\\n<answer> a </answer>"`` gives
    three segments: the search call (1), the observation block (0), the answer (1).
    """
    segments = []
    for piece in environment_text.split(content):
        if not piece:
            continue
        segments.append(Segment(piece, not environment_text.fullmatch(piece)))
    return segments


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a ``.parquet`` or ``.jsonl``/``.json`` file as dicts.

    Raises:
        ValueError: unknown extension or a line that is not JSON (names file and line).
    """
    path = Path(path)
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"{path}: SFT data must be .parquet or .jsonl, got {path.suffix!r}")
    rows = []
    with open(path) as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{line_no}: not JSON ({err})") from None
    return rows


def _to_list(value) -> list:
    # parquet gives numpy arrays of dicts for list columns
    return list(value) if not isinstance(value, (str, dict)) else value


def row_to_messages(row: dict, messages_key: str = "messages", prompt_key: str = "prompt",
                    response_key: str = "response", where: str = "row") -> list[dict]:
    """Normalise a row to a chat message list.

    Raises:
        ValueError: the row has neither ``messages_key`` nor ``prompt_key`` + ``response_key``.
    """
    if messages_key in row and row[messages_key] is not None:
        messages = [dict(m) for m in _to_list(row[messages_key])]
    elif prompt_key in row and response_key in row:
        prompt = row[prompt_key]
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = [dict(m) for m in _to_list(prompt)]
        messages.append({"role": "assistant", "content": str(row[response_key])})
    else:
        raise ValueError(f"{where}: needs {messages_key!r} or {prompt_key!r}+{response_key!r}; "
                         f"has keys {sorted(row)}")
    for m in messages:
        if "role" not in m or "content" not in m:
            raise ValueError(f"{where}: message without role/content: {m}")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: no assistant message, nothing to train on")
    return messages


def _chat_segments(tokenizer, messages: list[dict], environment_text: re.Pattern) -> list[Segment]:
    """Segments of a chat rendered with the tokenizer's template, assistant turns trainable.

    Each assistant turn contributes: the template text up to its content (not trainable), its
    content split into generated text and observations, then the end-of-turn token (trainable, so
    the model learns to stop) and any template text after it (not trainable).
    """
    def render(msgs, add_generation_prompt=False):
        return tokenizer.apply_chat_template(msgs, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)

    segments, rendered = [], ""
    eos = tokenizer.eos_token or ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        # The same prompt text RL builds: the template with the generation prompt.
        head = render(messages[:i], add_generation_prompt=True) if i else ""
        if not head.startswith(rendered):
            raise ValueError(
                f"chat template of {getattr(tokenizer, 'name_or_path', '?')!r} rewrites earlier "
                f"turns when rendering turn {i}; cannot build a segment-wise loss mask")
        content = message["content"]
        segments.append(Segment(head[len(rendered):], False))
        segments.extend(split_assistant_content(content, environment_text))
        full = render(messages[: i + 1])
        # Templates that rewrite the final assistant turn (Qwen3 moves <think> text) get the
        # generated form instead: content + eos, as the rollout engine would produce it.
        tail = full[len(head) + len(content):] if full.startswith(head + content) else eos
        if eos and tail.startswith(eos):
            segments.append(Segment(eos, True))
            tail = tail[len(eos):]
        segments.append(Segment(tail, False))
        rendered = "".join(s.text for s in segments)
    return [s for s in segments if s.text]


def _plain_segments(tokenizer, messages: list[dict], environment_text: re.Pattern) -> list[Segment]:
    """Segments for a tokenizer without a chat template: contents concatenated, eos after answers."""
    segments = []
    for message in messages:
        if message["role"] == "assistant":
            segments.extend(split_assistant_content(message["content"], environment_text))
            if tokenizer.eos_token:
                segments.append(Segment(tokenizer.eos_token, True))
        else:
            segments.append(Segment(message["content"], False))
    return [s for s in segments if s.text]


def message_segments(tokenizer, messages: list[dict], environment_text: re.Pattern) -> list[Segment]:
    """Text segments of a conversation with their trainable flags (chat template when present)."""
    if getattr(tokenizer, "chat_template", None):
        return _chat_segments(tokenizer, messages, environment_text)
    return _plain_segments(tokenizer, messages, environment_text)


def tokenize_segments(tokenizer, segments: Sequence[Segment]) -> tuple[list[int], list[int]]:
    """Token ids and loss mask, each segment tokenised on its own and concatenated.

    Returns:
        ``(input_ids, loss_mask)``, two lists of equal length; ``loss_mask[t] == 1`` when token
        ``t`` is a target of the SFT loss.
    """
    input_ids, loss_mask = [], []
    for segment in segments:
        ids = tokenizer(segment.text, add_special_tokens=False)["input_ids"]
        input_ids.extend(ids)
        loss_mask.extend([int(segment.trainable)] * len(ids))
    return input_ids, loss_mask


class SFTDataset(Dataset):
    """Tokenised SFT examples: ``{"input_ids": (L,), "loss_mask": (L,)}`` long tensors.

    Args:
        files: one or more ``.parquet``/``.jsonl`` paths.
        tokenizer: a Hugging Face tokenizer (its chat template is used when it has one).
        max_length: longest example in tokens; longer ones are cut on the right
            (``truncation="right"``), dropped (``"drop"``) or rejected (``"error"``).
        messages_key, prompt_key, response_key: column names.
        environment_text: pattern of the text inside assistant turns that the environment wrote
            (not trained on); the SFT trainer passes its environment's ``environment_text``.
    Raises:
        ValueError: bad rows (file and row index named), unknown truncation, or no examples left.
    """

    def __init__(self, files: str | Sequence[str], tokenizer, max_length: int = 1024,
                 truncation: str = "right", messages_key: str = "messages",
                 prompt_key: str = "prompt", response_key: str = "response", *, environment_text: re.Pattern):
        if truncation not in ("right", "drop", "error"):
            raise ValueError(f"truncation must be right|drop|error, got {truncation!r}")
        files = [files] if isinstance(files, (str, Path)) else list(files)
        self.examples: list[tuple[list[int], list[int]]] = []
        for path in files:
            for index, row in enumerate(read_rows(path)):
                where = f"{path} row {index}"
                messages = row_to_messages(row, messages_key, prompt_key, response_key, where)
                ids, mask = tokenize_segments(tokenizer, message_segments(tokenizer, messages, environment_text))
                if len(ids) > max_length:
                    if truncation == "error":
                        raise ValueError(f"{where}: {len(ids)} tokens > max_length={max_length}")
                    if truncation == "drop":
                        continue
                    ids, mask = ids[:max_length], mask[:max_length]
                if sum(mask) == 0:
                    continue  # nothing to learn after truncation
                self.examples.append((ids, mask))
        if not self.examples:
            raise ValueError(f"no SFT examples with trainable tokens in {files}")

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict:
        ids, mask = self.examples[index]
        return {"input_ids": torch.tensor(ids, dtype=torch.long),
                "loss_mask": torch.tensor(mask, dtype=torch.long)}

    def lengths(self) -> list[int]:
        """Token count of every example (for token-budget batching)."""
        return [len(ids) for ids, _ in self.examples]


def collate_right_padded(items: Sequence[dict], pad_token_id: int = 0) -> dict:
    """Right-pad a list of examples into a batch.

    Returns:
        ``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask``: (batch, max_len) long
        tensors. ``attention_mask`` comes from the lengths, never from comparing ids with pad.
    """
    max_len = max(len(item["input_ids"]) for item in items)
    batch = {key: torch.zeros(len(items), max_len, dtype=torch.long)
             for key in ("input_ids", "attention_mask", "position_ids", "loss_mask")}
    batch["input_ids"].fill_(pad_token_id)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        batch["input_ids"][row, :n] = item["input_ids"]
        batch["loss_mask"][row, :n] = item["loss_mask"]
        batch["attention_mask"][row, :n] = 1
        batch["position_ids"][row, :n] = torch.arange(n)
    return batch


def token_budget_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Split example indices (in the given order) into micro-batches of bounded padded size.

    A micro-batch's cost is ``len(batch) * longest`` (the padded tensor size); each stays within
    ``max_tokens`` unless a single example alone is longer. Indices are sorted by length first so
    similar lengths share a batch (less padding); the caller shuffles at the global-batch level.

    Raises:
        ValueError: ``max_tokens`` < 1.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, current, longest = [], [], 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if current and new_longest * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, new_longest = [], lengths[i]
        current.append(i)
        longest = new_longest
    if current:
        batches.append(current)
    return batches


def fixed_size_batches(num_items: int, size: int) -> Iterator[list[int]]:
    """Consecutive index chunks of ``size`` (the last may be shorter)."""
    for start in range(0, num_items, size):
        yield list(range(start, min(start + size, num_items)))
