"""The SFT loss mask, token by token: assistant text only, observations and prompts excluded."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from search_r1.envs.search_r1.prompts import INVALID_ACTION_MESSAGE, format_observation, make_prefix
from search_r1.envs.search_r1.prompts import ENVIRONMENT_TEXT
from verl.utils.dataset.sft_dataset import (SFTDataset, collate_right_padded, message_segments,
                                            split_assistant_content, token_budget_batches,
                                            tokenize_segments)

from .conftest import demo_assistant


def _token_spans(tokenizer, ids):
    """Character span of every token in the decoded text (ASCII data, so decode is additive)."""
    spans, pos = [], 0
    for i in ids:
        piece = tokenizer.decode([i])
        spans.append((pos, pos + len(piece)))
        pos += len(piece)
    return spans


def _trainable_ranges(text: str, assistant_turns: list[str], eos: str):
    """Char ranges the model generates, found independently from the rendered text."""
    ranges = []
    for turn in assistant_turns:
        start = text.index(turn)
        cursor = start
        for obs in [p for p in split_assistant_content(turn, ENVIRONMENT_TEXT) if not p.trainable]:
            obs_at = text.index(obs.text, cursor)
            ranges.append((cursor, obs_at))
            cursor = obs_at + len(obs.text)
        end = start + len(turn)
        ranges.append((cursor, end + len(eos)))  # the closing eos is trained too
    return ranges


@pytest.mark.parametrize("tokenizer_name", ["qwen", "smollm2"])
def test_mask_token_by_token(tokenizer_name, tiny_tokenizer):
    from transformers import AutoTokenizer

    from verl.utils.model_zoo import smollm2_dir

    tokenizer = tiny_tokenizer if tokenizer_name == "qwen" else AutoTokenizer.from_pretrained(smollm2_dir())
    turn1 = demo_assistant("capital of france", "Paris is the capital.", "Paris")
    turn2 = ("<think> bad </think>\n<serch> x" + INVALID_ACTION_MESSAGE
             + "<search> again </search>" + format_observation("Doc 1(Title: A) b\n") + "<answer> b </answer>")
    messages = [{"role": "user", "content": make_prefix("capital of france")},
                {"role": "assistant", "content": turn1},
                {"role": "user", "content": make_prefix("second question")},
                {"role": "assistant", "content": turn2}]
    turns = [turn1, turn2]
    if tokenizer_name == "qwen":
        # Qwen3's template drops <think> text from earlier assistant turns, so only a single
        # assistant turn has a well-defined prefix; multi-turn is checked on SmolLM2's ChatML.
        with pytest.raises(ValueError, match="rewrites earlier turns"):
            message_segments(tokenizer, messages, ENVIRONMENT_TEXT)
        messages, turns = [messages[0], {"role": "assistant", "content": turn2}], [turn2]
    ids, mask = tokenize_segments(tokenizer, message_segments(tokenizer, messages, ENVIRONMENT_TEXT))
    text = tokenizer.decode(ids)
    ranges = _trainable_ranges(text, turns, tokenizer.eos_token)
    trained_chars = 0
    for (start, end), m in zip(_token_spans(tokenizer, ids), mask):
        inside = any(lo <= start and end <= hi for lo, hi in ranges)
        assert m == int(inside), (text[start:end], m)
        trained_chars += (end - start) * m
    assert trained_chars == sum(hi - lo for lo, hi in ranges)
    # observations and the user turns contribute no target
    masked_text = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert "<information>" not in masked_text and "Question:" not in masked_text
    assert "My previous action is invalid" not in masked_text
    assert masked_text.count(tokenizer.eos_token) == len(turns)


def test_prompt_response_columns_and_parquet(tmp_path, tiny_tokenizer):
    prompt = [{"role": "user", "content": make_prefix("q")}]
    response = demo_assistant("q", "p", "a")
    pd.DataFrame([{"prompt": prompt, "response": response}]).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "d.jsonl").write_text(json.dumps({"messages": prompt + [{"role": "assistant",
                                                                          "content": response}]}) + "\n")
    from_parquet = SFTDataset(str(tmp_path / "d.parquet"), tiny_tokenizer, environment_text=ENVIRONMENT_TEXT)[0]
    from_jsonl = SFTDataset(str(tmp_path / "d.jsonl"), tiny_tokenizer, environment_text=ENVIRONMENT_TEXT)[0]
    assert from_parquet["input_ids"].tolist() == from_jsonl["input_ids"].tolist()
    assert from_parquet["loss_mask"].tolist() == from_jsonl["loss_mask"].tolist()


def test_bad_rows_name_the_file(tmp_path, tiny_tokenizer):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl row 0"):
        SFTDataset(str(path), tiny_tokenizer, environment_text=ENVIRONMENT_TEXT)
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(ValueError, match="no assistant message"):
        SFTDataset(str(path), tiny_tokenizer, environment_text=ENVIRONMENT_TEXT)


def test_truncation_modes(demo_jsonl, tiny_tokenizer):
    full = SFTDataset(demo_jsonl, tiny_tokenizer, max_length=4096, environment_text=ENVIRONMENT_TEXT)
    longest = max(full.lengths())
    cut = SFTDataset(demo_jsonl, tiny_tokenizer, max_length=longest - 5, environment_text=ENVIRONMENT_TEXT)
    assert max(cut.lengths()) == longest - 5
    with pytest.raises(ValueError, match="max_length"):
        SFTDataset(demo_jsonl, tiny_tokenizer, max_length=longest - 5, truncation="error",
                   environment_text=ENVIRONMENT_TEXT)


def test_token_budget_batches_cover_once_within_budget():
    lengths = [5, 300, 17, 64, 64, 1000, 2, 128, 90]
    batches = token_budget_batches(lengths, max_tokens=400)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        cost = len(batch) * max(lengths[i] for i in batch)
        assert cost <= 400 or len(batch) == 1


def test_collate_masks_from_lengths(tiny_tokenizer):
    import torch

    items = [{"input_ids": torch.tensor([5, 6, 7]), "loss_mask": torch.tensor([0, 1, 1])},
             {"input_ids": torch.tensor([tiny_tokenizer.pad_token_id]), "loss_mask": torch.tensor([1])}]
    batch = collate_right_padded(items, pad_token_id=tiny_tokenizer.pad_token_id)
    # a real token equal to pad still counts as a token
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
