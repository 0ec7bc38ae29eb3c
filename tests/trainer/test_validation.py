"""Validation figures are per-question statistics, whatever the batching (issue 17, item 6).

The real pieces of the trainer's validation path: Search-R1 parquet rows through ``RLHFDataset`` and
``InOrderBatches``, the real agent loop in the Search-R1 environment (a scripted engine writes the
turns), the real EM reward manager and the Qwen tokenizer.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from search_r1.envs.search_r1 import reward
from search_r1.envs.search_r1.prompts import make_prefix, question_of
from verl.utils.dataset.config import DataConfig
from tests.rollout.scripted import ScriptedEngine, search_loop
from verl.trainer.ppo import stages
from verl.trainer.ppo.data_loading import iterate_in_order
from verl.trainer.ppo.validation import read_records, run_validation
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.workers.reward_manager import RewardManager
from verl.workers.rollout.base import SamplingParams

NUM_ROWS = 101
FINISHED_ROW = 7  # the only row that answers (correctly); it falls in the first batch of 50


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from verl.utils.model_zoo import qwen_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(qwen_tokenizer_dir())
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok


@pytest.fixture(scope="module")
def dataset(tokenizer, tmp_path_factory):
    rows = [{"data_source": "nq" if i % 2 else "hotpotqa",
             "prompt": [{"role": "user", "content": make_prefix(f"what is the number {i}")}],
             "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": [str(i)]}},
             "extra_info": {"split": "test", "index": i, "uid": f"q-{i}"}} for i in range(NUM_ROWS)]
    path = tmp_path_factory.mktemp("val") / "test.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return RLHFDataset(str(path), tokenizer, DataConfig(max_start_length=512))


def _validate(dataset, tokenizer, batch_size: int, dump_dir=None, report=None, progress: bool = False,
              answer: str = "{i}") -> dict:
    prompts = [dataset[i]["raw_prompt_ids"] for i in range(len(dataset))]
    scripts = [[f"<answer> {answer.format(i=i)} </answer>"] if i == FINISHED_ROW else ["<search> number </search>", "<search> a number </search>"]
               for i in range(len(dataset))]
    engine = ScriptedEngine(tokenizer, prompts, scripts)
    config = dict(max_turns=1, max_start_length=512, max_prompt_length=1024,
                              max_response_length=256, max_obs_length=64, do_search=False)
    manager = search_loop(tokenizer, engine, **config)
    env = manager.env
    params = SamplingParams(temperature=0.0, max_tokens=32)

    def generate(batch, on_turn=None):  # what RayPPOTrainer.validate passes
        batch = stages.expand_groups(batch, 1)
        return stages.carry_row_fields(batch, manager.run(batch, params, on_turn=on_turn))

    batches = iterate_in_order(dataset, collate_fn, batch_size)
    return run_validation(batches, generate, RewardManager(tokenizer, reward.compute_score), tokenizer, env, dump_dir=dump_dir,
                          global_step=3, progress=progress, report=report)


def test_uneven_batches_weigh_every_question_once(dataset, tokenizer, tmp_path):
    """101 rows in batches of 50/50/1: a mean of batch means would give finish_ratio 1/150; the
    per-question value is 1/101, the same as with one batch of 101."""
    uneven = _validate(dataset, tokenizer, batch_size=50, dump_dir=tmp_path)
    whole = _validate(dataset, tokenizer, batch_size=NUM_ROWS)
    assert uneven["val/env/finish_ratio"] == pytest.approx(1 / NUM_ROWS)
    assert uneven["val/test_em/all"] == pytest.approx(1 / NUM_ROWS)
    assert uneven["val/test_em/nq"] == pytest.approx(1 / 50)  # row 7 is odd: nq holds rows 1, 3, ..., 99
    assert uneven["val/test_em/hotpotqa"] == 0.0
    # turns: the answering row takes 1, the others 2 (a search, then a search on the last turn)
    assert uneven["val/env/number_of_actions/mean"] == pytest.approx((1 + 2 * 100) / NUM_ROWS)
    assert uneven["val/env/number_of_valid_search"] == pytest.approx(2 * 100 / NUM_ROWS)
    assert uneven == pytest.approx(whole)

    records = read_records(tmp_path / "3.jsonl")
    assert len(records) == NUM_ROWS
    answered = records[FINISHED_ROW]
    assert answered["question"] == f"what is the number {FINISHED_ROW}?"
    assert answered["gold"] == [str(FINISHED_ROW)] and answered["answer"] == str(FINISHED_ROW)
    assert answered["em"] == 1.0 and answered["finished"] == 1 and answered["uid"] == f"q-{FINISHED_ROW}"
    assert answered["response_tokens"] == answered["response_length"] > 0
    other = records[0]
    assert other["answer"] is None and other["em"] == 0.0 and other["finished"] == 0
    assert other["valid_search"] == 2 and other["turns"] == 2
    assert other["response_length"] > other["response_tokens"]  # the observation is not generated
    assert np.mean([r["finished"] for r in records]) == pytest.approx(uneven["val/env/finish_ratio"])


def test_records_and_metrics_carry_f1_and_cover_em_beside_em(dataset, tokenizer, tmp_path):
    """The reward's per-row extras reach the records and ``val/test_f1/*``, ``val/test_cover_em/*``:
    "the number 7" for gold "7" is no exact match, but covers it, with token F1 2/3."""
    metrics = _validate(dataset, tokenizer, batch_size=NUM_ROWS, dump_dir=tmp_path, answer="the number {i}")
    answered = read_records(tmp_path / "3.jsonl")[FINISHED_ROW]
    assert (answered["em"], answered["cover_em"]) == (0.0, 1.0) and answered["f1"] == pytest.approx(2 / 3)
    assert metrics["val/test_em/all"] == 0.0
    assert metrics["val/test_cover_em/all"] == pytest.approx(1 / NUM_ROWS)
    assert metrics["val/test_f1/nq"] == pytest.approx(2 / 3 / 50)
    # whether a search's observation held the gold answer travels the same way: with do_search=False
    # no observation holds one, so every record and the metric say 0
    records = read_records(tmp_path / "3.jsonl")
    assert {r["retrieved"] for r in records} == {0.0} and metrics["val/test_retrieved/all"] == 0.0


def test_the_trainer_writes_a_report_beside_each_dump(dataset, tokenizer, tmp_path):
    """With trainer.validation_data_dir the trainer's report (trainer_setup.build_validation_report)
    goes to <dir>/<step>.html: the summary over all 101 questions, the trajectories of the first
    validation_report_questions of each source in turn."""
    from tests.report.helpers import page_data
    from verl.trainer.main_ppo import parse_config
    from verl.trainer.ppo.trainer_setup import build_validation_report

    overrides = [f"trainer.validation_data_dir={tmp_path}", "trainer.experiment_name=exp"]
    assert build_validation_report(parse_config(overrides[1:])) is None
    assert build_validation_report(parse_config(overrides + ["trainer.validation_report_questions=0"])) is None
    report = build_validation_report(parse_config(overrides + ["trainer.validation_report_questions=6"]))
    _validate(dataset, tokenizer, batch_size=50, dump_dir=tmp_path, report=report)
    html = (tmp_path / "3.html").read_text()
    assert "Validation of exp at step 3" in html and "<td>nq</td><td>50</td>" in html
    assert "<td>hotpotqa</td><td>51</td>" in html and "Trajectories of 6 of the 101 questions" in html
    questions = page_data(html)["questions"]
    assert [q["uid"] for q in questions] == [f"q-{i}" for i in range(6)]
    searched = questions[0]["sides"][0]
    assert [t["action"] for t in searched["turns"]] == ["search", "search"]
    assert searched["turns"][0]["observation"] == "empty"  # do_search=False: an empty <information> block


def test_question_of_reads_the_template_field():
    text = "<|im_start|>user\n" + make_prefix("who wrote hamlet") + "<|im_end|>\n<|im_start|>assistant\n"
    assert question_of(text) == "who wrote hamlet?"
    assert question_of("a prompt without the marker ") == "a prompt without the marker"


def test_progress_shows_each_turn_of_a_batch(dataset, tokenizer, capsys, monkeypatch):
    """One batch of 101 questions in two turns: after turn 1 the answering row counts as done and
    100 rows are still generating; the bar then reaches 101/101 (with its time estimate)."""
    monkeypatch.setenv("COLUMNS", "250")  # the bar's width when stderr is no terminal
    _validate(dataset, tokenizer, batch_size=NUM_ROWS, progress=True)
    updates = [part for line in capsys.readouterr().err.splitlines() for part in line.split("\r") if part.strip()]
    turn_1 = [u for u in updates if "batch 1, turn 1/2: 100 rows generating" in u]
    assert turn_1 and "1/101" in turn_1[-1], updates
    assert any("101/101" in u and "batch 1, turn 2/2: 0 rows generating" in u for u in updates), updates
    assert all("<" in u for u in turn_1)  # tqdm's elapsed<remaining estimate
