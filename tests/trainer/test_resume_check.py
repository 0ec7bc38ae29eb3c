"""A checkpoint is resumed only by a run on the data it was trained on and with steps left to train.

The checkpoints are written by the trainer's own writer (:func:`checkpointing.save_checkpoint`, its
worker part empty); the end-to-end test runs the real trainer twice on one checkpoint folder.
"""

from __future__ import annotations

import subprocess

import pytest

from verl.trainer.ppo import checkpointing
from verl.trainer.ppo.config import default_config
from verl.trainer.ppo.resume_check import RECORD_KEY, check_resume, train_data_record
from verl.utils.config import ConfigError

from .helpers import run_main


def _checkpoint(root, step: int, train_file=None) -> None:
    state = {"data": {"epoch": 0, "position": step}, "kl_coef": 0.0}
    if train_file is not None:
        state[RECORD_KEY] = train_data_record(str(train_file))
    checkpointing.save_checkpoint(root, step, state, lambda folder: None)


def _config(root, **trainer):
    return default_config(trainer={"default_local_dir": str(root), **trainer})


@pytest.fixture
def files(tmp_path):
    quick, mine = tmp_path / "example_train.jsonl", tmp_path / "mine_train.jsonl"
    quick.write_text('{"question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}\n')
    mine.write_text('{"question": "who painted the mona lisa", "golden_answers": ["Leonardo da Vinci"]}\n')
    return quick, mine


def test_other_data_is_refused_with_what_to_do(tmp_path, files):
    quick, mine = files
    _checkpoint(tmp_path / "ckpt", 3, quick)
    with pytest.raises(ConfigError) as error:
        check_resume(_config(tmp_path / "ckpt"), train_data_record(str(mine)), total_steps=2)
    line = str(error.value)
    assert "\n" not in line and f"{tmp_path / 'ckpt' / 'global_step_3'} was trained on {quick}" in line
    assert f"not on data.train_files={mine}" in line
    assert "EXPERIMENT_NAME=NAME" in line and "trainer.resume_mode=disable" in line


def test_a_target_step_already_reached_is_refused(tmp_path, files):
    quick, _ = files
    _checkpoint(tmp_path / "ckpt", 3, quick)
    record = train_data_record(str(quick))
    for total in (2, 3):
        with pytest.raises(ConfigError, match=f"already at global step 3 and this run trains to step {total}: "
                                              "nothing to train; set trainer.total_training_steps above 3"):
            check_resume(_config(tmp_path / "ckpt"), record, total_steps=total)
    check_resume(_config(tmp_path / "ckpt"), record, total_steps=6)  # more steps on the same data: resumes
    check_resume(_config(tmp_path / "ckpt"), record, total_steps=None)  # epochs: the trainer decides later


def test_fresh_starts_validation_and_old_checkpoints_pass(tmp_path, files):
    quick, mine = files
    other = train_data_record(str(mine))
    check_resume(_config(tmp_path / "empty"), other, total_steps=2)  # nothing to resume
    _checkpoint(tmp_path / "ckpt", 3, quick)
    check_resume(_config(tmp_path / "ckpt", resume_mode="disable"), other, total_steps=2)
    check_resume(_config(tmp_path / "ckpt", val_only=True), other, total_steps=2)
    _checkpoint(tmp_path / "old", 3)  # written before checkpoints recorded their data: the step still counts
    check_resume(_config(tmp_path / "old"), other, total_steps=4)
    with pytest.raises(ConfigError, match="already at global step 3"):
        check_resume(_config(tmp_path / "old"), other, total_steps=3)


def test_the_record_follows_the_content_not_the_path(tmp_path, files):
    quick, _ = files
    moved = tmp_path / "moved" / quick.name
    moved.parent.mkdir()
    moved.write_bytes(quick.read_bytes())
    assert [r["sha256"] for r in train_data_record(str(moved))] == [r["sha256"] for r in train_data_record(str(quick))]
    record = train_data_record([str(quick), str(moved)])
    assert [r["path"] for r in record] == [str(quick), str(moved)] and record[0]["bytes"] == quick.stat().st_size


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, lines
    return lines[0]


@pytest.mark.slow
def test_the_trainer_records_its_data_and_refuses_a_rerun(straight_run, qa_parquet):
    """A real run (the session's 4-step ``straight_run``) writes its train files into the checkpoint; the
    same command again (its target already reached) and a run on other data stop in one line before
    any worker starts."""
    base, out = straight_run
    state = checkpointing.load_trainer_state(out / "global_step_4")
    assert [r["path"] for r in state[RECORD_KEY]] == [qa_parquet["train"]]

    again, other = run_main(base), run_main(base + [f"data.train_files={qa_parquet['test']}"])
    line = _one_error_line(again)
    assert line.startswith(f"error: trainer.resume_mode=auto: {out / 'global_step_4'} is already at global step 4")
    line = _one_error_line(other)
    assert f"was trained on {qa_parquet['train']}, not on data.train_files={qa_parquet['test']}" in line
    for result in (again, other):
        assert "run plan:" not in result.stdout  # refused before the plan is printed and any worker starts
