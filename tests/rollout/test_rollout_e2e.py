"""A multi-turn rollout with the real engines and the real retriever server (searches forced)."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from search_r1.llm_agent.generation import GenerationConfig, LLMGenerationManager
from search_r1.llm_agent.observation import ObservationEncoder
from search_r1.llm_agent.parsing import parse_action
from tests.rollout.conftest import chat_prompt
from verl.protocol import DataProto
from verl.workers.rollout.base import SamplingParams

pytestmark = pytest.mark.slow

PREFIX = "<think>I need to look this up.</think>\n<search>"
QUESTIONS = ["Where was Manuel Díaz Rodríguez born?", "What did Manuel Díaz Rodríguez write?"]


def rollout(engine, tokenizer, retriever):
    prompts = [chat_prompt(tokenizer, q, PREFIX) for q in QUESTIONS]
    batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts})
    config = GenerationConfig(max_turns=2, max_prompt_length=900, max_response_length=400, max_obs_length=200)
    manager = LLMGenerationManager(tokenizer, engine, config, retriever)
    return prompts, manager.run_llm_loop(batch, SamplingParams(temperature=0, max_tokens=48))


def observation_spans(mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate(mask + [1]):
        if m == 0 and start is None:
            start = i
        elif m == 1 and start is not None:
            spans.append((start, i))
            start = None
    return spans


@pytest.mark.parametrize("engine_name", ["hf_engine", "vllm_engine"])
def test_multi_turn_search_rollout(engine_name, request, tokenizer, retriever):
    engine = request.getfixturevalue(engine_name)
    prompts, out = rollout(engine, tokenizer, retriever)
    encoder = ObservationEncoder(tokenizer, 200)
    width = out.batch["prompts"].shape[1]
    for row, prompt in enumerate(prompts):
        real = out.batch["attention_mask"][row, width:].bool()
        length = int(real.sum())
        assert bool(real[:length].all())  # right padded, no holes
        response = out.batch["responses"][row, :length].tolist()
        mask = out.batch["response_mask"][row, :length].tolist()
        log_probs = out.batch["rollout_log_probs"][row, :length].tolist()
        # round trip: the whole sequence is prompt + response, token for token
        seq = out.batch["input_ids"][row][out.batch["attention_mask"][row].bool()].tolist()
        assert seq == prompt + response
        assert all(math.isfinite(lp) and lp <= 0 for lp, m in zip(log_probs, mask) if m == 1)
        assert all(lp == 0 for lp, m in zip(log_probs, mask) if m == 0)
        spans = observation_spans(mask)
        assert spans, "the forced search produced no observation"
        # the first observation is exactly the tokenised retrieval result for the model's query
        query = parse_action("<search>" + tokenizer.decode(response[:spans[0][0]])).content
        assert query
        docs = retriever.retrieve([query])[0]
        assert response[spans[0][0]:spans[0][1]] == encoder.search(docs)[0]
        assert tokenizer.decode(response[spans[0][0]:spans[0][1]]).endswith("</information>\n\n")
    assert int(out.batch["valid_search"].sum()) >= len(prompts)


def test_engines_agree_on_greedy_rollout(hf_engine, vllm_engine, tokenizer, retriever):
    _, hf_out = rollout(hf_engine, tokenizer, retriever)
    _, vllm_out = rollout(vllm_engine, tokenizer, retriever)
    assert torch.equal(hf_out.batch["responses"], vllm_out.batch["responses"])
    assert torch.equal(hf_out.batch["response_mask"], vllm_out.batch["response_mask"])
