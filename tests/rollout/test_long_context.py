"""The paper recipe's contexts fit the engine: with ``rollout.max_model_len: null`` the engine length
comes from the data budgets, and a multi-turn rollout whose context passes 2,048 tokens completes
on the real vLLM CPU engine."""

from __future__ import annotations

import json

import pytest

from tests.rollout.scripted import search_loop
from tests.rollout.conftest import REPO, chat_prompt
from verl.protocol import DataProto
from verl.utils.dataset.config import DataConfig
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.config import RolloutConfig, engine_max_model_len

pytestmark = pytest.mark.slow

# Budgets of a long-context run (the paper's are 4096 / 500); the engine length follows from them.
DATA = DataConfig(max_prompt_length=3072, max_response_length=48, max_start_length=2600, max_obs_length=400)
PREFIX = "<think>I need to look this up.</think>\n<search>"


def long_question(tokenizer, min_tokens: int) -> str:
    """A question preceded by real Wikipedia background text, at least ``min_tokens`` long."""
    passages = [json.loads(line)["contents"] for line in (REPO / "example" / "corpus.jsonl").open()]
    text, i = "", 0
    while len(tokenizer.encode(text)) < min_tokens:
        text += passages[i].replace("\n", " ") + " "
        i += 1
    return f"Background: {text}\nWhere was Manuel Díaz Rodríguez born?"


def test_engine_length_follows_the_budgets():
    assert engine_max_model_len(RolloutConfig(), DATA) == 3072 + 48
    assert engine_max_model_len(RolloutConfig(), DataConfig()) == 4096 + 500


def test_multi_turn_context_past_2048_tokens_completes(long_context_vllm_engine, tokenizer, retriever):
    prompt = chat_prompt(tokenizer, long_question(tokenizer, 1950), PREFIX)
    assert 2000 < len(prompt) < DATA.max_start_length
    config = dict(max_turns=2, max_start_length=DATA.max_start_length,
                              max_prompt_length=DATA.max_prompt_length,
                              max_response_length=DATA.max_response_length * 3 + DATA.max_obs_length * 2,
                              max_obs_length=DATA.max_obs_length)
    manager = search_loop(tokenizer, long_context_vllm_engine, retriever, **config)
    out = manager.run(DataProto.from_dict(non_tensors={"raw_prompt_ids": [prompt]}),
                               SamplingParams(temperature=0, max_tokens=DATA.max_response_length))
    total = int(out.batch["attention_mask"][0].sum())
    assert int(out.batch["valid_search"][0]) >= 1 and int(out.batch["turns"][0]) >= 2
    assert total > 2048 + DATA.max_obs_length // 4, total
    mask = out.batch["response_mask"][0].tolist()[:total - len(prompt)]
    last_observation = max(i for i, m in enumerate(mask) if m == 0)
    generated_after = [i for i, m in enumerate(mask) if m == 1 and i > last_observation]
    # the engine generated again on the context after the observation, which is past 2,048 tokens
    assert generated_after and len(prompt) + last_observation + 1 > 2048
