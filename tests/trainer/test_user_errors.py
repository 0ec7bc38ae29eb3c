"""A user's mistakes get one line that names the culprit and what to do, not a traceback.

Bad model paths (infer.py, the trainer), a retriever that does not answer (infer.py), and an
interpreter without the project's packages (the shell entry points, e.g. ``.venv`` not active).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from verl.utils.model_path import check_model_path

REPO = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], env_overrides: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           **(env_overrides or {})}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_infer_names_a_missing_model_folder(tmp_path):
    missing = tmp_path / "no_such_model"
    line = _one_error_line(_run([sys.executable, "infer.py", "--model", str(missing), "--question", "x"]))
    assert f"--model={missing}: no such folder" in line and "huggingface" in line


def test_infer_names_a_folder_that_holds_no_model(tmp_path):
    line = _one_error_line(_run([sys.executable, "infer.py", "--model", str(tmp_path), "--question", "x"]))
    assert f"--model={tmp_path}: this folder has no config.json" in line


def test_infer_names_an_unreachable_retriever(tiny_qwen_path):
    from search_r1.search.launcher import free_port

    url = f"http://127.0.0.1:{free_port()}/retrieve"  # nothing listens there
    line = _one_error_line(_run([sys.executable, "infer.py", "--model", tiny_qwen_path, "--retriever_url", url,
                                 "--question", "x", "--engine", "hf"]))
    assert f"--retriever_url {url}: no retriever answers" in line
    assert "retrieval_launch.sh" in line and "--no_search" in line


@pytest.mark.parametrize("env", ["search_r1", "tool_call"])
def test_infer_answers_in_each_environment(env, tiny_qwen_path):
    """infer.py runs the training's loop in the environment the model was trained in: the prompt is
    that environment's (tool_call: the chat template with the search tool) and the run ends with the
    final-answer line (a random model answers nothing)."""
    result = _run([sys.executable, "infer.py", "--model", tiny_qwen_path, "--env", env, "--no_search", "--engine",
                   "hf", "--question", "who wrote hamlet", "--max_turns", "1", "--max_tokens", "4",
                   "--max_model_len", "2048"], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Final answer: (none)" in result.stdout and "'turns': " in result.stdout


def test_trainer_names_a_missing_model_path():
    line = _one_error_line(_run([sys.executable, "-m", "verl.trainer.main_ppo",
                                 "actor_rollout_ref.model.path=/nonexistent/model"]))
    assert line.startswith("error: actor_rollout_ref.model.path=/nonexistent/model: no such folder")


def test_trainer_names_a_missing_data_file(tiny_qwen_path, tmp_path):
    missing = tmp_path / "train.parquet"
    line = _one_error_line(_run([sys.executable, "-m", "verl.trainer.main_ppo",
                                 f"actor_rollout_ref.model.path={tiny_qwen_path}", f"data.train_files={missing}"]))
    assert line.startswith(f"error: data.train_files={missing}: no such file")


def test_check_model_path_cases(tmp_path, monkeypatch):
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "model.Q4.gguf").write_bytes(b"")
    check_model_path(str(tmp_path / "gguf"), "model.path")  # a GGUF folder (read with gguf_file)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    check_model_path(str(tmp_path / "hf"), "model.path")
    with pytest.raises(ValueError, match="model.path is empty"):
        check_model_path("", "model.path")
    with pytest.raises(ValueError, match="is a file"):
        check_model_path(str(tmp_path / "hf" / "config.json"), "model.path")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    with pytest.raises(ValueError, match="no-such-owner/no-such-model: no such folder, and no hub model"):
        check_model_path("no-such-owner/no-such-model", "model.path")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    check_model_path("no-such-owner/no-such-model", "model.path")  # online: the hub decides


@pytest.fixture
def bare_python(tmp_path) -> str:
    """An interpreter that sees no site-packages: a Python without the project's environment."""
    path = tmp_path / "bare_python"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize("script", ["train_ppo.sh", "train_grpo.sh"])
def test_train_scripts_name_an_inactive_environment(script, bare_python):
    line = _one_error_line(_run(["bash", script], {"PYTHON": bare_python, "N_GPUS": "0"}))
    assert line.startswith(f"{script}: {bare_python} cannot import torch, transformers")
    assert ". .venv/bin/activate" in line and "fastapi" in line
    line = _one_error_line(_run(["bash", script], {"PYTHON": "/nonexistent/python", "N_GPUS": "0"}))
    assert line.startswith(f"{script}: no '/nonexistent/python' on PATH")


def test_retrieval_launch_names_an_inactive_environment(bare_python):
    line = _one_error_line(_run(["bash", "retrieval_launch.sh"], {"PYTHON": bare_python, "RETRIEVER": "bm25"}))
    assert line.startswith(f"retrieval_launch.sh: {bare_python} cannot import fastapi, uvicorn")
    assert "bm25s" in line and ". .venv/bin/activate" in line


def test_evaluate_and_infer_name_an_inactive_environment(bare_python):
    line = _one_error_line(_run(["bash", "evaluate.sh"], {"PYTHON": bare_python, "N_GPUS": "0"}))
    assert line.startswith(f"evaluate.sh: {bare_python} cannot import torch, transformers")
    line = _one_error_line(_run([bare_python, "infer.py", "--model", "x", "--question", "y"]))
    assert line.startswith("error: ") and "cannot import torch" in line and ". .venv/bin/activate" in line


def _trainer(tiny_qwen_path: str, train: str, *extra: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "verl.trainer.main_ppo", f"actor_rollout_ref.model.path={tiny_qwen_path}",
                 f"data.train_files={train}", f"data.val_files={train}", *extra], timeout=300)


def test_trainer_names_an_unreachable_retriever_before_any_worker(tiny_qwen_path, qa_parquet):
    url = "http://127.0.0.1:9/retrieve"
    line = _one_error_line(_trainer(tiny_qwen_path, qa_parquet["train"], f"retriever.url={url}"))
    assert line.startswith(f"error: no retriever answers at {url}") and "retrieval_launch.sh" in line


def _write_rows(path: Path, qa_parquet: dict, drop: str | None = None, **column) -> str:
    import pandas as pd

    frame = pd.read_parquet(qa_parquet["train"])
    frame = frame.drop(columns=[drop]) if drop else frame.assign(**column)
    frame.to_parquet(path)
    return str(path)


def test_trainer_names_a_data_file_without_a_column(tiny_qwen_path, qa_parquet, tmp_path):
    train = _write_rows(tmp_path / "no_reward.parquet", qa_parquet, drop="reward_model")
    line = _one_error_line(_trainer(tiny_qwen_path, train, "do_search=false"))
    assert line.startswith(f"error: {train}: no column 'reward_model'")


def test_trainer_names_a_data_source_without_a_reward(tiny_qwen_path, qa_parquet, tmp_path):
    train = _write_rows(tmp_path / "mydata.parquet", qa_parquet, data_source="mydata")
    line = _one_error_line(_trainer(tiny_qwen_path, train, "do_search=false"))
    assert line.startswith(f"error: {train}: data_source 'mydata' has no reward function") and "'nq'" in line


def _train_script(tmp_path, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    """``bash train_grpo.sh`` on the CPU default, with an empty model cache (a fresh machine)."""
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    return _run(["bash", "train_grpo.sh", *overrides], {"N_GPUS": "0", "SEARCH_R1_CACHE": str(cache), **env},
                timeout=300)


def _built_nothing(tmp_path, result: subprocess.CompletedProcess) -> None:
    assert list((tmp_path / "cache").iterdir()) == []  # neither SmolLM2's conversion nor the warm start
    commands = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert commands == []  # no data build, index build, retrieval server or trainer


def test_train_script_checks_the_configuration_before_building_anything(tmp_path):
    result = _train_script(tmp_path, "trainer.total_epochz=1")
    line = _one_error_line(result)
    assert line == "error: trainer.total_epochz: Key 'total_epochz' not in 'TrainerConfig'; did you mean 'total_epochs'?"
    _built_nothing(tmp_path, result)


def test_train_script_never_fills_a_data_dir(tmp_path):
    data = tmp_path / "mine"
    data.mkdir()
    result = _train_script(tmp_path, DATA_DIR=str(data))
    line = _one_error_line(result)
    assert line.startswith(f"error: DATA_DIR={data}: the folder {data} has no train.parquet, test.parquet "
                           f"(looked for {data / 'train.parquet'}, {data / 'test.parquet'})")
    assert list(data.iterdir()) == []
    _built_nothing(tmp_path, result)


def test_train_script_refuses_a_checkpoint_it_cannot_continue(tmp_path):
    """docs/quickstart.md's custom-data command after the quick start: the quick start's checkpoint
    (same experiment folder) was trained on other data, or has passed the target step."""
    from verl.trainer.ppo import checkpointing
    from verl.trainer.ppo.resume_check import RECORD_KEY, train_data_record

    quick, mine = tmp_path / "quick.jsonl", tmp_path / "mine.jsonl"
    quick.write_text('{"question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}\n')
    mine.write_text('{"question": "who painted the mona lisa", "golden_answers": ["Leonardo da Vinci"]}\n')
    ckpt = tmp_path / "ckpt"
    checkpointing.save_checkpoint(ckpt, 3, {"data": {"epoch": 0, "position": 3}, "kl_coef": 0.0,
                                            RECORD_KEY: train_data_record(str(quick))}, lambda folder: None)
    steps = "trainer.total_training_steps=2"
    result = _train_script(tmp_path, f"data.train_files={mine}", f"data.val_files={mine}", steps, CKPT_DIR=str(ckpt))
    line = _one_error_line(result)
    assert f"{ckpt / 'global_step_3'} was trained on {quick}, not on data.train_files={mine}" in line
    assert "EXPERIMENT_NAME=NAME" in line
    _built_nothing(tmp_path, result)
    result = _train_script(tmp_path, f"data.train_files={quick}", f"data.val_files={mine}", steps, CKPT_DIR=str(ckpt))
    assert "is already at global step 3 and this run trains to step 2: nothing to train" in _one_error_line(result)
    _built_nothing(tmp_path, result)


def test_trainer_names_data_smaller_than_one_batch(tiny_qwen_path, tmp_path):
    """A user's first JSONL (FlashRAG's form, read directly) with fewer questions than a batch."""
    from .helpers import tiny_overrides

    train = tmp_path / "train.jsonl"
    train.write_text('{"id": "0", "question": "who wrote hamlet", "golden_answers": ["William Shakespeare"]}\n')
    overrides = tiny_overrides(tiny_qwen_path, {"train": str(train), "test": str(train)}, "http://127.0.0.1:9/retrieve",
                               tmp_path / "run", "grpo")
    line = _one_error_line(_run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides, "do_search=false"],
                                timeout=300))
    assert line == f"error: data.train_batch_size=3 is larger than the dataset (1 rows); data.train_files={train}"


@pytest.mark.parametrize("choice", ["env.name=tool_call", "+recipe=search_r1pp"])
def test_train_script_takes_the_other_environment_and_presets_on_the_cpu_default(tmp_path, choice):
    """The embedded default's Search-R1 format reward is added in Search-R1's environment only, and
    Search-R1++ turns it off for its F1 reward: both configurations pass the check, so the first
    error here is the (empty) data folder's."""
    data = tmp_path / "mine"
    data.mkdir()
    result = _train_script(tmp_path, choice, DATA_DIR=str(data))
    assert _one_error_line(result).startswith(f"error: DATA_DIR={data}: the folder {data} has no train.parquet")
    _built_nothing(tmp_path, result)


def test_train_script_does_not_start_a_retriever_for_a_remote_url(tmp_path):
    """A retriever URL on another machine that does not answer is named, not bound to locally."""
    url = "http://192.0.2.1:8000/retrieve"  # TEST-NET-1: routes nowhere
    result = _train_script(tmp_path, WARM_START="0", RETRIEVER_URL=url)
    assert _one_error_line(result).startswith(f"error: no retriever answers at {url}; start it there")
    assert "retrieval server" not in result.stdout
