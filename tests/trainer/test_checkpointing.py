"""Atomic checkpoints: a kill mid-save leaves the previous checkpoint usable; retention; resume modes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from verl.trainer.ppo import checkpointing


def _writer(content: str):
    def save_workers(folder: Path) -> None:
        (folder / "actor").mkdir()
        (folder / "actor" / "model.txt").write_text(content)
    return save_workers


def test_save_find_prune_and_resume_modes(tmp_path):
    for step in (2, 4, 6):
        checkpointing.save_checkpoint(tmp_path, step, {"data": {"epoch": 0, "position": step}},
                                      _writer(f"w{step}"), max_to_keep=2)
    assert sorted(checkpointing.complete_steps(tmp_path)) == [4, 6]
    assert (tmp_path / checkpointing.LATEST_FILE).read_text() == "6"
    latest = checkpointing.resolve_resume_path("auto", tmp_path)
    assert latest == tmp_path / "global_step_6"
    state = checkpointing.load_trainer_state(latest)
    assert state["global_step"] == 6 and state["data"]["position"] == 6
    assert checkpointing.resolve_resume_path("disable", tmp_path) is None
    assert checkpointing.resolve_resume_path(str(tmp_path / "global_step_4"), tmp_path) == tmp_path / "global_step_4"
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        checkpointing.resolve_resume_path(str(tmp_path / "global_step_2"), tmp_path)


def test_controller_rng_roundtrip(tmp_path):
    import random

    import numpy as np
    import torch

    checkpointing.save_checkpoint(tmp_path, 1, {}, _writer("x"))
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    checkpointing.load_trainer_state(tmp_path / "global_step_1")
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_stale_pointer_falls_back_to_highest_complete(tmp_path):
    checkpointing.save_checkpoint(tmp_path, 3, {}, _writer("a"))
    (tmp_path / checkpointing.LATEST_FILE).write_text("9")  # points at a folder that never completed
    (tmp_path / "global_step_9").mkdir()
    assert checkpointing.find_latest(tmp_path) == tmp_path / "global_step_3"


def test_kill_during_save_keeps_previous_checkpoint(tmp_path):
    """A real process is SIGKILLed while its worker state is being written."""
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from verl.trainer.ppo import checkpointing

        def save_ok(folder):
            (folder / "actor").mkdir(); (folder / "actor" / "model.txt").write_text("step2")

        def save_slow(folder):
            (folder / "actor").mkdir(); (folder / "actor" / "model.txt").write_text("partial")
            Path({str(tmp_path / 'writing')!r}).write_text("now")
            time.sleep(60)

        checkpointing.save_checkpoint({str(tmp_path / 'ckpt')!r}, 2, {{"data": {{"epoch": 0, "position": 2}}}}, save_ok)
        checkpointing.save_checkpoint({str(tmp_path / 'ckpt')!r}, 4, {{"data": {{"epoch": 0, "position": 4}}}}, save_slow)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2])
    deadline = time.time() + 60
    while not (tmp_path / "writing").exists():
        assert proc.poll() is None and time.time() < deadline, "writer process ended early"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    root = tmp_path / "ckpt"
    latest = checkpointing.resolve_resume_path("auto", root)
    assert latest == root / "global_step_2"
    assert (latest / "actor" / "model.txt").read_text() == "step2"
    assert json.loads((latest / checkpointing.STATE_FILE).read_text())["data"]["position"] == 2
    assert not (root / "global_step_4").exists()
    # The next save of the same step replaces the leftover temporary folder.
    checkpointing.save_checkpoint(root, 4, {}, _writer("step4"))
    assert checkpointing.find_latest(root) == root / "global_step_4"


def test_signal_during_save_leaves_no_partial_checkpoint(tmp_path):
    """A real SIGINT arrives while the workers' part of step 4 is written: the save stops
    (RunStopped), and once the writer is done the partial folder is discarded; step 2 stays latest."""
    from verl.utils.signals import RunStopped, stop_on_signals

    def save_interrupted(folder: Path) -> None:
        (folder / "actor").mkdir()
        (folder / "actor" / "model.txt").write_text("partial")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # the signal's handler raises before this ends

    checkpointing.save_checkpoint(tmp_path, 2, {}, _writer("step2"))
    with pytest.raises(RunStopped):
        with stop_on_signals():
            checkpointing.save_checkpoint(tmp_path, 4, {}, save_interrupted)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # stop_on_signals leaves them ignored after a stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert (tmp_path / ".global_step_4.tmp").is_dir()  # what a save cut short leaves ...
    assert checkpointing.discard_partial(tmp_path, 4) == [tmp_path / ".global_step_4.tmp"]  # ... until discarded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", checkpointing.LATEST_FILE]
    assert checkpointing.find_latest(tmp_path) == tmp_path / "global_step_2"
