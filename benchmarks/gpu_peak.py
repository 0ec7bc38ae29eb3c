"""Record the peak memory of the whole GPU 0 (all processes, ``nvidia-smi``) while something else runs.

    python benchmarks/gpu_peak.py --out RUN_DIR/gpu_peak.json &   # then the run; then kill %1 (SIGTERM)

A run's own torch counters miss the memory of its other processes (vLLM's engine-core process,
another CUDA context); the device's whole-GPU figure does not. Every new peak rewrites ``--out``
(``peak_gpu_memory_gib`` and, at that peak, each process's share ``peak_gpu_memory_by_process_gib``,
GiB; ``samples``: how many had been taken when it was reached; ``interval_s``), so whenever the sampler
is stopped the file holds the peak so far. Stops on SIGTERM or SIGINT, or when ``--pid`` has exited.
Without ``nvidia-smi`` it writes nothing and exits 0 after one line on stderr (a CPU machine: no GPU to
measure).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import threading
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GpuMemorySampler  # noqa: E402


class RecordingSampler(GpuMemorySampler):
    """:class:`GpuMemorySampler` that writes its peak to ``out`` whenever the peak rises."""

    def __init__(self, out: Path, interval_s: float):
        super().__init__(interval_s)
        self.out, self.samples = out, 0

    def sample(self) -> None:
        before = self.peak_gib
        super().sample()
        self.samples += 1
        if self.peak_gib > before:
            record = {"peak_gpu_memory_gib": round(self.peak_gib, 2),
                      "peak_gpu_memory_by_process_gib": self.by_process,
                      "samples": self.samples, "interval_s": self.interval_s}
            tmp = self.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(record) + "\n")
            tmp.replace(self.out)  # a reader never sees half a file


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (an exited child its parent has not reaped yet counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON rewritten at every new peak")
    parser.add_argument("--interval_s", type=float, default=1.0)
    parser.add_argument("--pid", type=int, default=None, help="stop once this process has exited")
    args = parser.parse_args(argv)
    if shutil.which("nvidia-smi") is None:
        print("gpu_peak: no nvidia-smi on PATH, nothing to record", file=sys.stderr)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with RecordingSampler(args.out, args.interval_s):
        while not stop.wait(args.interval_s):
            if args.pid is not None and not alive(args.pid):
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
