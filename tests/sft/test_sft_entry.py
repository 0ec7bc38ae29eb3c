"""The SFT entry point as the warm start runs it: a progress bar per step with the time left, and a
Ctrl-C that ends it in one line (issue 32, items 6 and 8). A tiny real-tokenizer model, real FSDP2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _command(model_dir, train_file, out_dir, steps: int) -> list[str]:
    # batches of 2 demonstrations: the bar and the stop are per step whatever its size, and a step's
    # cost is the LM head over the Qwen vocabulary at every token
    return [sys.executable, "-m", "verl.trainer.fsdp_sft_trainer", f"model.path={model_dir}",
            f"data.train_files={train_file}", "data.train_batch_size=2", "data.max_token_len_per_gpu=1024",
            "model.enable_gradient_checkpointing=false", f"trainer.total_training_steps={steps}",
            f"trainer.default_local_dir={out_dir}", "trainer.save_freq=-1", "trainer.save_optimizer=false",
            "trainer.logger=[console]"]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", COLUMNS="200")


def _parts(text: str) -> list[str]:
    return [part for line in text.splitlines() for part in line.split("\r") if part.strip()]


def test_progress_bar_counts_the_steps_with_an_estimate(tiny_model_dir, demo_jsonl, tmp_path):
    result = subprocess.run(_command(tiny_model_dir, demo_jsonl, tmp_path / "out", steps=3), cwd=REPO,
                            env=_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    bars = [part for part in _parts(result.stderr) if part.startswith("sft:")]
    for step in (1, 2, 3):
        assert any(f" {step}/3 [" in bar for bar in bars), bars
    assert any(" 1/3 [" in bar and "<" in bar and "loss=" in bar for bar in bars), bars  # elapsed<left, loss


def test_ctrl_c_stops_in_one_line(tiny_model_dir, demo_jsonl, tmp_path):
    proc = subprocess.Popen(_command(tiny_model_dir, demo_jsonl, tmp_path / "out", steps=100000), cwd=REPO,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: [lines.extend(_parts(raw.decode(errors="replace")))
                                              for raw in iter(proc.stdout.readline, b"")], daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while not any("step:1 - " in line for line in lines):  # the console logger's line (after the bar's)
            assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines[-40:])
            time.sleep(0.1)
        seen = len(lines)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        assert proc.wait(timeout=120) == 130
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    after = [line for line in lines[seen:] if not line.startswith(("sft:", "step:"))]
    assert after == ["stopped by SIGINT"], lines[seen:]
