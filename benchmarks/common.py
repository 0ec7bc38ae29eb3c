"""Shared benchmark plumbing: run metadata, process-tree memory sampling, JSON reports."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def run_metadata() -> dict:
    """Commit, command line, machine and library versions, for every report."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = "unknown"
    versions = {}
    for name in ("torch", "transformers", "vllm", "trl", "ray"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # a missing optional package is reported as absent, not an error
            versions[name] = None
    return {
        "commit": commit,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(),
                    "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)},
        "versions": versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


class TreeMemorySampler:
    """Samples the summed RSS of a process and all its descendants; keeps the peak (GiB).

    Ray workers and vLLM engine processes are children of the measured process, so the peak of the
    whole tree is the memory a user must provision.
    """

    def __init__(self, pid: int, interval_s: float = 0.5):
        self.pid, self.interval_s, self.peak_gib = pid, interval_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree_rss(self) -> int:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_gib = max(self.peak_gib, self._tree_rss() / 2**30)
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_measured(cmd: list[str], env: dict | None = None, timeout_s: float | None = None) -> dict:
    """Run ``cmd`` as a child process; return wall time, exit code and the tree's peak RSS."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})})
    with TreeMemorySampler(proc.pid) as sampler:
        returncode = proc.wait(timeout=timeout_s)
    return {"returncode": returncode, "wall_s": time.perf_counter() - start,
            "peak_rss_gib": round(sampler.peak_gib, 2)}


def save_report(name: str, report: dict) -> Path:
    """Write ``report`` (with run metadata) to benchmarks/results/<name>.json and print it."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    report = {"meta": run_metadata(), **report}
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print(f"saved {path}")
    return path
