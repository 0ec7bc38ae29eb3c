"""Ctrl-C and SIGTERM stop a real training run cleanly (issue 32, item 6).

``scripts/quickstart.py`` (what ``train_*.sh`` run) with a tiny PPO run through Ray: it starts its own
BM25 retriever, the trainer, Ray and the worker process. Once a step is done the run gets SIGINT
the way a terminal sends it (to the whole process group) or SIGTERM the way ``kill`` does (to the
top process only). Then: it exits with the shell's status for the signal, the output after the
signal is one line saying it stopped (no traceback), no process of the run is left, and the
checkpoint folder holds only complete steps with the latest pointer on one of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from verl.trainer.ppo import checkpointing

from .conftest import CORPUS, _free_port
from .helpers import REPO, tiny_overrides

pytestmark = pytest.mark.slow

PROGRESS_BARS = ("training:", "validation:")  # tqdm's lines (redrawn on close)


class Run:
    """The quickstart wrapper as a user starts it, its output collected line by line (``\\r`` too)."""

    def __init__(self, cmd: list[str], env: dict) -> None:
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # its own process group, as a terminal job
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines += [part for part in raw.decode(errors="replace").rstrip("\n").split("\r") if part.strip()]

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, "run ended early:\n" + "\n".join(self.lines[-60:])
            assert time.monotonic() < deadline, "no " + text + ":\n" + "\n".join(self.lines[-60:])
            time.sleep(0.2)

    def processes(self) -> list[psutil.Process]:
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]


def _alive(processes: list[psutil.Process]) -> list[str]:
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return left


@pytest.fixture
def run_command(tiny_qwen_path, qa_parquet, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(CORPUS)))
    url = f"http://127.0.0.1:{_free_port()}/retrieve"
    out = tmp_path / "checkpoints"
    overrides = tiny_overrides(tiny_qwen_path, qa_parquet, url, out, "ppo") + [
        "trainer.backend=ray", "trainer.total_training_steps=1000", "trainer.save_freq=1"]
    cmd = [sys.executable, "scripts/quickstart.py", "--data-dir", str(tmp_path / "data"), "--corpus", str(corpus),
           "--index-dir", str(tmp_path / "bm25"), "--retriever-url", url, *overrides]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(REPO), COLUMNS="200")
    env.pop("WARM_START", None)
    return cmd, env, out


@pytest.mark.parametrize("signum, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["SIGINT-to-the-group", "SIGTERM-to-the-wrapper"])
def test_signal_stops_the_run_cleanly(signum, to_group, run_command):
    cmd, env, out = run_command
    run = Run(cmd, env)
    try:
        run.wait_for("step:1 - ", timeout=900)  # the console logger's line of step 1: it is training
        processes = run.processes()
        assert any("ray::" in " ".join(p.cmdline()) for p in processes), [p.cmdline() for p in processes]
        assert any("retrieval_server" in " ".join(p.cmdline()) for p in processes)
        seen = len(run.lines)
        if to_group:
            os.killpg(run.proc.pid, signum)
        else:
            run.proc.send_signal(signum)
        returncode = run.proc.wait(timeout=300)
        run.reader.join(timeout=30)
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)

    after = [line for line in run.lines[seen:] if not line.lstrip().startswith(PROGRESS_BARS)]
    name = signal.Signals(signum).name
    assert returncode == 128 + signum, "\n".join(run.lines[-80:])
    assert not any("Traceback" in line for line in run.lines[seen:]), "\n".join(run.lines[seen:])
    assert len(after) == 1 and after[0].startswith(f"stopped by {name}: workers and Ray shut down"), after
    latest = checkpointing.find_latest(out)
    assert latest is not None and str(latest) in after[0]

    assert _alive(processes) == []  # trainer, Ray's processes, the worker, the retriever: all ended
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    steps = [p for p in out.iterdir() if p.name.startswith("global_step_")]
    assert steps and all(checkpointing.is_complete(p) for p in steps)
    assert out / f"global_step_{(out / checkpointing.LATEST_FILE).read_text()}" == latest
