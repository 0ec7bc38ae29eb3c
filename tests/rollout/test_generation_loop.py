"""Bookkeeping of the search loop: real tokenizer, real retriever server, scripted engine.

Every test taking ``mode`` checks the same contract on the sync loop and on the async rollout.
"""

from __future__ import annotations

import pytest
import torch

from search_r1.envs.search_r1 import SearchR1Environment
from search_r1.envs.search_tool import SearchTool
from search_r1.envs.search_r1.prompts import INVALID_ACTION_MESSAGE, format_observation
from search_r1.search.passages import format_passages
from verl.protocol import DataProto
from verl.workers.rollout.base import SamplingParams

from tests.rollout.scripted import ScriptedEngine, search_loop

PARAMS = SamplingParams(temperature=0, max_tokens=64)


def make_batch(tokenizer, questions):
    prompts = [tokenizer.encode(f"Question: {q}\n", add_special_tokens=False) for q in questions]
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return prompts, DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask})


def run(tokenizer, retriever, scripts, mode="sync", **config):
    prompts, batch = make_batch(tokenizer, [f"q{i}" for i in range(len(scripts))])
    engine = ScriptedEngine(tokenizer, prompts, scripts)
    cfg = dict(**{"max_turns": 2, "max_response_length": 400, "max_obs_length": 200, "mode": mode,
                              **config})
    manager = search_loop(tokenizer, engine, retriever, **cfg)
    return prompts, engine, manager.run(batch, PARAMS)


def response_text(tokenizer, out, row, masked=None):
    mask = out.batch["response_mask"][row].bool()
    real = out.batch["attention_mask"][row, out.batch["prompts"].shape[1]:].bool()
    keep = real if masked is None else (real & (mask if masked else ~mask))
    return tokenizer.decode(out.batch["responses"][row][keep])


def test_answer_in_first_turn(tokenizer, retriever, mode):
    _, engine, out = run(tokenizer, retriever, [["<think>easy</think><answer> Paris </answer>"]], mode)
    assert len(engine.calls) == 2  # the answer turn + the EOS-closing call
    assert out.batch["finished"].tolist() == [1] and out.batch["turns"].tolist() == [1]
    assert out.batch["response_mask"][0].sum() == out.batch["attention_mask"][0, -400:].sum()
    # the closing call sampled the EOS (== pad): it is kept, attended and trained on
    assert response_text(tokenizer, out, 0).endswith("</answer><|im_end|>")


def test_search_then_answer_first_wins_and_text_after_stop_is_cut(tokenizer, retriever, mode):
    scripts = [["<search> Manuel Díaz Rodríguez </search> trailing text <answer>x</answer>",
                "<answer> Venezuela </answer>"]]
    _, engine, out = run(tokenizer, retriever, scripts, mode)
    generated = response_text(tokenizer, out, 0, masked=True)
    assert "trailing text" not in generated and generated.startswith("<search> Manuel Díaz Rodríguez </search>")
    observation = response_text(tokenizer, out, 0, masked=False)
    assert observation.startswith("\n\n<information>Doc 1(Title: ") and observation.endswith("</information>\n\n")
    assert "Manuel" in observation
    assert out.batch["valid_search"].tolist() == [1] and out.batch["valid_action"].tolist() == [2]
    assert out.batch["finished"].tolist() == [1]


def test_invalid_action_gets_corrective_message(tokenizer, retriever, mode):
    scripts = [["<search></search>", "<search>capital\nof France</search>", "<answer>Paris</answer>"]]
    _, _, out = run(tokenizer, retriever, scripts, mode)
    observation = response_text(tokenizer, out, 0, masked=False)
    assert observation.startswith(INVALID_ACTION_MESSAGE)
    assert out.batch["valid_action"].tolist() == [2] and out.batch["turns"].tolist() == [3]


def test_max_turns_exhausted(tokenizer, retriever, mode):
    scripts = [["<search>a</search>", "<search>b</search>", "<search>c</search>", "<answer>never</answer>"]]
    _, engine, out = run(tokenizer, retriever, scripts, mode, max_turns=2, max_response_length=1000)
    assert out.batch["turns"].tolist() == [3]  # 2 search rounds + the final search-free generation
    assert response_text(tokenizer, out, 0).count("<information>") == 2
    assert out.batch["finished"].tolist() == [0] and out.batch["truncated"].tolist() == [0]


def test_only_active_rows_are_sent(tokenizer, retriever, mode):
    scripts = [["<answer>done</answer>"], ["<search>Berkshire</search>", "<answer>x</answer>"]]
    prompts, engine, out = run(tokenizer, retriever, scripts, mode)
    requests = [context for call in engine.calls for context in call]
    per_row = [sum(context[:len(p)] == p for context in requests) for p in prompts]
    assert per_row == [2, 3]  # row 0: turn 1 + EOS closing; row 1: two turns + EOS closing
    if mode == "sync":
        assert [len(call) for call in engine.calls] == [2, 1, 2]  # turn 1, turn 2 (row 1), EOS closing
        assert engine.calls[1][0][:len(prompts[1])] == prompts[1]


def test_observation_truncation_keeps_closing_tag(tokenizer, retriever, mode):
    scripts = [["<search>England writer journalist</search>", "<answer>x</answer>"]]
    _, _, out = run(tokenizer, retriever, scripts, mode, max_obs_length=40)
    mask = out.batch["response_mask"][0]
    real = out.batch["attention_mask"][0, -400:].bool()
    obs_ids = out.batch["responses"][0][real & ~mask.bool()]
    assert len(obs_ids) == 40 and out.batch["obs_truncated"].tolist() == [1]
    assert tokenizer.decode(obs_ids).endswith("</information>\n\n")


def test_context_overflow_ends_row_truncated_and_keeps_question(tokenizer, retriever, mode):
    scripts = [["<search>Berkshire</search>", "<answer>x</answer>"]]
    prompts, _, out = run(tokenizer, retriever, scripts, mode, max_prompt_length=40)
    assert out.batch["truncated"].tolist() == [1]
    assert out.batch["prompts"][0, -len(prompts[0]):].tolist() == prompts[0]
    assert response_text(tokenizer, out, 0) == "<search>Berkshire</search>"


def test_do_search_false_gives_empty_information(tokenizer, mode):
    scripts = [["<search>Berkshire</search>", "<answer>x</answer>"]]
    _, _, out = run(tokenizer, None, scripts, mode, do_search=False)
    assert response_text(tokenizer, out, 0, masked=False) == "\n\n<information></information>\n\n"
    assert out.batch["empty_search"].tolist() == [1]  # a search answered with no passage


def test_shapes_masks_positions(tokenizer, retriever, mode):
    scripts = [["<answer>a</answer>"], ["<search>Berkshire</search>", "<answer>b</answer>"]]
    prompts, _, out = run(tokenizer, retriever, scripts, mode)
    b = out.batch
    width = b["prompts"].shape[1]
    assert b["input_ids"].shape == (2, width + 400) and b["responses"].shape == (2, 400)
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    assert torch.equal(b["position_ids"], (b["attention_mask"].cumsum(-1) - 1).clamp(min=0))
    assert b["valid_search"].tolist() == [0, 1] and b["empty_search"].tolist() == [0, 0]
    # response_mask is a subset of the real tokens; log-probs are 0 off the mask
    assert bool((b["response_mask"] <= b["attention_mask"][:, width:]).all())
    assert bool((b["rollout_log_probs"][b["response_mask"] == 0] == 0).all())
    for row, prompt in enumerate(prompts):
        assert b["input_ids"][row][b["attention_mask"][row].bool()][:len(prompt)].tolist() == prompt


def test_rollout_without_log_probs_asks_the_engine_for_none(tokenizer, retriever, mode):
    scripts = [["<answer>a</answer>"], ["<search>Berkshire</search>", "<answer>b</answer>"]]
    _, asked, with_log_probs = run(tokenizer, retriever, scripts, mode)
    _, not_asked, out = run(tokenizer, retriever, scripts, mode, log_probs=False)
    assert set(asked.logprobs_asked) == {True} and set(not_asked.logprobs_asked) == {False}
    assert "rollout_log_probs" in with_log_probs.batch.keys() and "rollout_log_probs" not in out.batch.keys()
    for key in ("responses", "response_mask", "attention_mask", "valid_search"):
        assert torch.equal(out.batch[key], with_log_probs.batch[key]), key


def test_observation_tokens_are_the_tokenised_observation(tokenizer, retriever, mode):
    from search_r1.envs.search_r1.prompts import format_observation
    from search_r1.search.passages import format_passages
    scripts = [["<search>England writer</search>", "<answer>x</answer>"]]
    _, _, out = run(tokenizer, retriever, scripts, mode, max_obs_length=1000)
    docs = retriever.retrieve(["England writer"])[0]
    expected = tokenizer.encode(format_observation(format_passages(docs)), add_special_tokens=False)
    real = out.batch["attention_mask"][0, -400:].bool()
    obs = out.batch["responses"][0][real & ~out.batch["response_mask"][0].bool()].tolist()
    assert obs == expected


def test_retriever_down_fails_clearly(tokenizer, mode):
    from search_r1.search.client import RetrieverClient, RetrieverError
    from search_r1.search.launcher import free_port
    dead = RetrieverClient(f"http://127.0.0.1:{free_port()}/retrieve", timeout=2.0, max_retries=1, backoff=0.1)
    with pytest.raises(RetrieverError, match="127.0.0.1"):
        run(tokenizer, dead, [["<search>x</search>", "<answer>y</answer>"]], mode)


def test_observation_encoder_rejects_tiny_budget(tokenizer):
    with pytest.raises(ValueError, match="max_obs_length"):
        SearchR1Environment(tokenizer, SearchTool(None), 5)


def test_prompt_that_opens_the_search_tag(tokenizer, retriever, mode):
    prompts = [tokenizer.encode("Question: q?\n<search>", add_special_tokens=False)]
    engine = ScriptedEngine(tokenizer, prompts, [["England writer</search>", "<answer>x</answer>"]])
    manager = search_loop(tokenizer, engine, retriever, max_turns=2, max_response_length=400,
                          max_obs_length=200, mode=mode)
    out = manager.run(DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts}), PARAMS)
    assert out.batch["valid_search"].tolist() == [1] and out.batch["finished"].tolist() == [1]
    assert out.non_tensor_batch["action_prefix"].tolist() == ["<search>"]


MIXED_SCRIPTS = [
    ["<answer>done</answer>"],
    ["<search>Berkshire</search>", "<search></search>", "<answer>x</answer>"],
    ["<think>hmm</think>a closing tag only </search>", "<search>Manuel Díaz Rodríguez</search>", "<answer>y</answer>"],
    ["<search>a writer</search>", "<search>b</search>", "<search>c</search>", "<answer>late</answer>"],
]


def test_sync_and_async_give_the_same_trajectories(tokenizer, retriever):
    """The async rollout is the sync loop's contract, row for row: ids, masks, log-probs, stats."""
    _, _, sync = run(tokenizer, retriever, MIXED_SCRIPTS, "sync", max_response_length=600)
    _, _, async_ = run(tokenizer, retriever, MIXED_SCRIPTS, "async", max_response_length=600)
    assert sorted(sync.batch.keys()) == sorted(async_.batch.keys())
    for key in sync.batch.keys():
        assert torch.equal(sync.batch[key], async_.batch[key]), key
    assert sync.non_tensor_batch["action_prefix"].tolist() == async_.non_tensor_batch["action_prefix"].tolist()
    assert sync.batch["turns"].tolist() == [1, 3, 3, 3] and sync.batch["finished"].tolist() == [1, 1, 1, 0]


def test_mode_must_be_known():
    from verl.workers.rollout.agent_loop import LoopConfig

    with pytest.raises(ValueError, match="rollout mode.*'asynchronous'"):
        LoopConfig(max_turns=1, max_start_length=8, max_prompt_length=16, max_response_length=8, mode="asynchronous",
                   log_probs=True)


def test_unknown_mode_fails_before_any_model_loads(tiny_qwen_path, tmp_path):
    """``rollout.mode=asynchronous`` stops the real entry point with one line naming the value,
    before the workers (and their models) start."""
    from tests.trainer.conftest import QA, _row
    from tests.trainer.helpers import run_main, tiny_overrides

    import pandas as pd

    data = str(tmp_path / "rows.parquet")
    pd.DataFrame([_row(q, a, i, "train") for i, (q, a) in enumerate(QA)]).to_parquet(data)
    overrides = tiny_overrides(tiny_qwen_path, {"train": data, "test": data}, "http://127.0.0.1:9/retrieve",
                               tmp_path / "out", "grpo")
    result = run_main(overrides + ["actor_rollout_ref.rollout.mode=asynchronous"], timeout=300)
    assert result.returncode != 0
    assert "actor_rollout_ref.rollout.mode='asynchronous': choose one of ['async', 'sync']" in result.stderr
    assert "init_model" not in result.stderr and "WorkerHost" not in result.stderr


def test_a_query_several_rows_ask_is_retrieved_once(tokenizer, retriever, retriever_server):
    """Sync mode sends each distinct query of a turn once (the server counts what it received);
    every row still gets the passages of its own query."""
    import httpx

    def served() -> int:
        return httpx.get(retriever_server.retrieve_url.replace("/retrieve", "/stats")).json()["queries"]

    scripts = [["<search>England writer</search>", "<answer>x</answer>"]] * 3 + \
              [["<search>Hiccup voice actor</search>", "<answer>y</answer>"]]
    before = served()
    _, _, out = run(tokenizer, retriever, scripts, "sync", max_obs_length=1000)
    assert served() - before == 2
    for row, query in enumerate(["England writer"] * 3 + ["Hiccup voice actor"]):
        expected = tokenizer.encode(format_observation(format_passages(retriever.retrieve([query])[0])),
                                    add_special_tokens=False)
        real = out.batch["attention_mask"][row, -400:].bool()
        assert out.batch["responses"][row][real & ~out.batch["response_mask"][row].bool()].tolist() == expected


def test_observation_cache_gives_the_uncached_ids_and_private_copies(tokenizer, retriever):
    docs = retriever.retrieve(["England writer"])[0]
    for budget in (1000, 40):  # fits whole / cut inside the passages
        cached = SearchR1Environment(tokenizer, SearchTool(None), budget).observations
        content = format_passages(docs).strip()
        first, cut = cached.wrap(content)
        first.append(-1)  # the caller owns its list: the cache must not see this
        again, cut_again = cached.wrap(content)
        fresh, fresh_cut = SearchR1Environment(tokenizer, SearchTool(None), budget).observations._encode(content)
        assert again == fresh and cut_again == cut == fresh_cut == (budget == 40)
        assert len(cached._cache) == 1


def test_sync_turns_send_the_rows_newest_first(tokenizer, retriever):
    """Each sync turn sends its rows in the reverse of the last turn's order (the engine's prefix cache
    evicts the least recently finished rows first); the output keeps the batch's row order."""
    scripts = [["<search>a</search>", "<search>b</search>", "<answer>0</answer>"],
               ["<answer>1</answer>"],
               ["<search>c</search>", "<search>d</search>", "<answer>2</answer>"],
               ["<search>e</search>", "<answer>3</answer>"]]
    prompts, engine, out = run(tokenizer, retriever, scripts, "sync", max_turns=3, max_response_length=1000)

    def rows_of(call):
        return [next(i for i, p in enumerate(prompts) if context[:len(p)] == p) for context in call]

    turns = [rows_of(call) for call in engine.calls]
    assert turns == [[0, 1, 2, 3], [3, 2, 0], [0, 2], [2, 0, 3, 1]]  # 3 turns, then the EOS closing
    answers = [response_text(tokenizer, out, row) for row in range(4)]
    assert all(f"<answer>{row}</answer>" in text for row, text in enumerate(answers)), answers
    assert out.batch["turns"].tolist() == [3, 1, 3, 2]
