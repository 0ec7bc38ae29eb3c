"""``bash evaluate.sh`` as a user runs it: the embedded default end to end, and its one-line errors.

The end-to-end run is the session's ``embedded_evaluation`` (tests/conftest.py): the CPU default on
the first two questions of each of the seven sources, the run the report's browser test opens too.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _evaluate(args: list[str], timeout: int = 600, **env) -> subprocess.CompletedProcess:
    child_env = {k: v for k, v in os.environ.items()
                 if k not in ("DATA_DIR", "BASE_MODEL", "RETRIEVER_URL", "START_RETRIEVER", "CKPT_DIR")}
    child_env.update(PYTHONPATH=str(REPO), VLLM_CPU_KVCACHE_SPACE="1", **env)
    return subprocess.run(["bash", str(REPO / "evaluate.sh"), *args], cwd=REPO, env=child_env,
                          capture_output=True, text=True, timeout=timeout)


def _error_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(lines) == 1, result.stdout[-2000:] + result.stderr[-3000:]
    return lines[0]


@pytest.mark.slow
def test_embedded_default_end_to_end(embedded_evaluation, monkeypatch):
    result, out, url = embedded_evaluation
    monkeypatch.setenv("SEARCH_R1_CACHE", str(out.parent / "search_r1_cache"))  # the fixture's own cache
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert f"+ retrieval server on {url}" in result.stdout
    import warm_start

    assert f"evaluating {warm_start.warm_start_dir()} (the SmolLM2 warm start; no checkpoint under " in result.stdout
    assert "validation: 100%" in result.stderr and "14/14" in result.stderr  # the progress bar over questions
    assert "batch 1, turn 1/" in result.stderr and "rows generating" in result.stderr  # ... moved on every turn
    with pytest.raises(httpx.HTTPError):  # the retriever evaluate.sh started is stopped again
        httpx.post(url, json={"queries": ["x"], "topk": 1}, timeout=2)

    records = [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]
    sources = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]
    assert [r["data_source"] for r in records] == [s for s in sources for _ in range(2)]
    first = records[0]
    assert first["question"] == "who played daisy duke in the new dukes of hazzard?"  # example/qa/nq/test.jsonl row 0
    assert first["gold"] == ["Jessica Simpson"] and first["uid"] == "nq-test-0"
    for key in ("output", "answer", "em", "score", "valid_search", "response_tokens", "turns", "finished"):
        assert key in first, key
    assert all(0 < r["response_tokens"] <= r["response_length"] for r in records)
    # the warm start searches and answers within evaluation's turn budgets (not a table of zeros)
    assert sum(r["valid_search"] for r in records) > 0 and sum("</answer>" in r["output"] for r in records) > 0
    assert evaluation_settings(out)["max_response_length"] == 96

    evaluation = json.loads((out / "evaluation.json").read_text())
    table = evaluation["table"]
    assert list(table["sources"]) == sources
    assert all(row["count"] == 2 for row in table["sources"].values())
    ems = [r["em"] for r in records]
    assert table["average"]["em"] == pytest.approx(sum(ems) / 14)
    assert evaluation["metrics"]["val/test_em/all"] == pytest.approx(table["pooled"]["em"])
    assert evaluation["step"] == 0 and evaluation["max_per_source"] == 2 and evaluation["commit"]
    assert evaluation["data"][0].endswith("test.parquet") and evaluation["settings"]["sampling"]["do_sample"] is False
    markdown = (out / "evaluation.md").read_text()
    assert "| **average** (7 sources) | 14 |" in markdown and "Table 2" in markdown
    assert markdown.split("\n\n", 1)[1] in result.stdout  # the table is printed too


@pytest.mark.slow
def test_compare_two_results(embedded_evaluation, tmp_path):
    _, out, _ = embedded_evaluation
    result = _evaluate(["--compare", str(out / "evaluation.json"), str(out / "evaluation.json"),
                        "--out", str(tmp_path / "cmp.json")])
    assert result.returncode == 0, result.stderr
    assert "| nq |" in result.stdout and "paired" in result.stdout
    compared = json.loads((tmp_path / "cmp.json").read_text())
    assert compared["average"]["diff"] == 0.0 and compared["average"]["diff_ci"] == [0.0, 0.0]


def test_missing_checkpoint_is_one_line(tmp_path):
    line = _error_line(_evaluate([], BASE_MODEL=str(tmp_path / "global_step_9" / "huggingface"),
                                 DATA_DIR=str(tmp_path), RETRIEVER_URL="http://127.0.0.1:9/retrieve"))
    assert "does not exist" in line and "global_step_9" in line


def test_unreachable_retriever_is_one_line(tiny_model, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _search_r1_rows().to_parquet(data / "test.parquet")
    url = f"http://127.0.0.1:{_free_port()}/retrieve"
    line = _error_line(_evaluate([], BASE_MODEL=tiny_model, DATA_DIR=str(data), RETRIEVER_URL=url, START_RETRIEVER="0"))
    assert f"no retriever answers at {url}" in line and "retrieval_launch.sh" in line


def test_parquet_without_expected_columns_is_one_line(tiny_model, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _search_r1_rows().drop(columns=["reward_model"]).to_parquet(data / "test.parquet")
    line = _error_line(_evaluate([], BASE_MODEL=tiny_model, DATA_DIR=str(data),
                                 RETRIEVER_URL="http://127.0.0.1:9/retrieve"))
    assert str(data / "test.parquet") in line and "'reward_model'" in line and "qa_search_test_merge.py" in line


def evaluation_settings(out: Path) -> dict:
    return json.loads((out / "evaluation.json").read_text())["settings"]


def test_without_a_model_the_quick_starts_latest_export_is_evaluated(tmp_path):
    """The no-argument run takes the newest complete checkpoint of the quick start's run (its
    ``huggingface/`` export), written by the trainer's own checkpoint writer."""
    import evaluate

    from verl.trainer.ppo import checkpointing

    def export(folder: Path) -> None:
        (folder / "huggingface").mkdir()
        (folder / "huggingface" / "config.json").write_text("{}")

    run = tmp_path / "example-grpo-smollm2"
    for step in (3, 6):
        checkpointing.save_checkpoint(run, step, {}, export)
    model, what = evaluate.default_model(str(run))
    assert model == str(run / "global_step_6" / "huggingface") and what == f"the latest checkpoint of {run}"


def test_a_config_typo_fails_before_any_model_or_server(tmp_path):
    result = _evaluate(["trainer.total_epochz=1"], CKPT_DIR=str(tmp_path / "no_run"), SEARCH_R1_CACHE=str(tmp_path))
    assert "did you mean 'total_epochs'?" in _error_line(result)
    assert "evaluating" not in result.stdout and "+ " not in result.stdout and list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from benchmarks.save_random_model import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny"), arch="qwen2")


def _search_r1_rows() -> pd.DataFrame:
    from search_r1.envs.search_r1.prompts import make_prefix

    return pd.DataFrame([{"data_source": "nq", "prompt": [{"role": "user", "content": make_prefix("who wrote hamlet")}],
                          "ability": "fact-reasoning",
                          "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare"]}},
                          "extra_info": {"split": "test", "index": 0, "uid": "nq-test-0"}}])
