"""A multi-turn rollout with the real engines and the real retriever server (searches forced),
in both rollout modes (the async runs carry ``async`` in their ids)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.rollout.scripted import search_loop
from search_r1.envs.search_r1 import SearchR1Environment
from search_r1.envs.search_tool import SearchTool
from search_r1.envs.search_r1.parsing import parse_action
from tests.rollout.conftest import chat_prompt
from verl.protocol import DataProto
from verl.workers.rollout.base import SamplingParams

pytestmark = pytest.mark.slow

PREFIX = "<think>I need to look this up.</think>\n<search>"
QUESTIONS = ["Where was Manuel Díaz Rodríguez born?", "What did Manuel Díaz Rodríguez write?"]


def rollout(engine, tokenizer, retriever, mode="sync", prompts=None):
    prompts = prompts or [chat_prompt(tokenizer, q, PREFIX) for q in QUESTIONS]
    batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts})
    config = dict(max_turns=2, max_prompt_length=900, max_response_length=400, max_obs_length=200,
                              mode=mode)
    manager = search_loop(tokenizer, engine, retriever, **config)
    return prompts, manager.run(batch, SamplingParams(temperature=0, max_tokens=48))


def observation_spans(mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate(mask + [1]):
        if m == 0 and start is None:
            start = i
        elif m == 1 and start is not None:
            spans.append((start, i))
            start = None
    return spans


@pytest.fixture(scope="module")
def greedy_rollouts(tokenizer, retriever):
    """``get(request, engine_name, mode) -> (prompts, out)``: :func:`rollout` of each engine and mode, run
    once in this module; the multi-turn checks and the agreement check look at the same rollouts."""
    done = {}

    def get(request, engine_name: str, mode: str):
        if (engine_name, mode) not in done:
            done[engine_name, mode] = rollout(request.getfixturevalue(engine_name), tokenizer, retriever, mode)
        return done[engine_name, mode]

    return get


@pytest.mark.parametrize("engine_name", ["hf_engine", "vllm_engine"])
def test_multi_turn_search_rollout(engine_name, request, greedy_rollouts, tokenizer, retriever, mode):
    prompts, out = greedy_rollouts(request, engine_name, mode)
    env = SearchR1Environment(tokenizer, SearchTool(None), 200)
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
        assert response[spans[0][0]:spans[0][1]] == env.render(docs).ids
        assert tokenizer.decode(response[spans[0][0]:spans[0][1]]).endswith("</information>\n\n")
    assert int(out.batch["valid_search"].sum()) >= len(prompts)


def test_engines_and_modes_agree_on_greedy_rollout(request, greedy_rollouts, vllm_engine, tokenizer, retriever):
    """Greedy rollouts (validation) are the same on both engines in both modes (the rollouts the
    multi-turn test checked), and repeat exactly (the async one run again here: arrival order does not
    change a greedy trajectory)."""
    runs = {(name, mode): greedy_rollouts(request, f"{name}_engine", mode)[1]
            for name in ("hf", "vllm") for mode in ("sync", "async")}
    runs["vllm", "async again"] = rollout(vllm_engine, tokenizer, retriever, "async")[1]
    reference = runs["hf", "sync"]
    for key, out in runs.items():
        for name in ("responses", "response_mask", "turns", "valid_search", "finished", "truncated"):
            assert torch.equal(out.batch[name], reference.batch[name]), (key, name)
        torch.testing.assert_close(out.batch["rollout_log_probs"], reference.batch["rollout_log_probs"],
                                   atol=1e-2, rtol=0, msg=str(key))


COPY_PROMPT = "Write exactly this and nothing else: <search> who wrote Hamlet </search><think>"


@pytest.mark.parametrize("engine_name", ["hf_engine", "vllm_engine"])
def test_real_merged_stop_token_is_not_trained_or_sent_back(engine_name, request, tokenizer, retriever, mode):
    """SmolLM2 copies ``</search><think>`` and completes the stop string with its ``><`` token: the
    turn ends at ``</search>`` (the ``>`` comes from the environment, mask 0) on both engines."""
    engine = request.getfixturevalue(engine_name)
    text = tokenizer.apply_chat_template([{"role": "user", "content": COPY_PROMPT}], tokenize=False,
                                         add_generation_prompt=True)
    prompt = tokenizer.encode(text + "<search>", add_special_tokens=False)
    sampled = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=24, stop=["</search>", "</answer>"]))[0]
    assert tokenizer.decode(sampled.token_ids[-1:]) == "><", "the model no longer emits the merged token"
    _, out = rollout(engine, tokenizer, retriever, mode, prompts=[prompt])
    real = out.batch["attention_mask"][0, -400:].bool()
    response = out.batch["responses"][0][real].tolist()
    mask = out.batch["response_mask"][0][real].tolist()
    first_obs = mask.index(0)
    assert response[:first_obs] == sampled.token_ids[:-1]  # every trained token was sampled
    assert tokenizer.decode(response[first_obs:first_obs + 1]) == ">"
    decoded = tokenizer.decode(response)
    assert decoded.lstrip().startswith("who wrote Hamlet </search>\n\n<information>Doc 1(Title: ")
    assert "</search><" not in decoded


def test_failed_async_rollout_leaves_the_vllm_engine_clean(vllm_engine, tokenizer):
    """A search that fails for good ends the async rollout with the retriever's error; the requests
    it left in vLLM are dropped, so the next (sync) generation is unaffected."""
    from search_r1.search.client import RetrieverClient, RetrieverError
    from search_r1.search.launcher import free_port

    dead = RetrieverClient(f"http://127.0.0.1:{free_port()}/retrieve", timeout=1.0, max_retries=0)
    params = SamplingParams(temperature=0, max_tokens=24)
    prompts = [chat_prompt(tokenizer, q, PREFIX) for q in QUESTIONS] + [chat_prompt(tokenizer, "Who wrote Hamlet?")]
    before = vllm_engine.generate(prompts, params)
    with pytest.raises(RetrieverError, match="127.0.0.1"):
        rollout(vllm_engine, tokenizer, dead, "async", prompts=prompts)
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()
    after = vllm_engine.generate(prompts, params)
    assert [o.token_ids for o in after] == [o.token_ids for o in before]
