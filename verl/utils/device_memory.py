"""Peak memory per phase of a step (generation, log-probs, updates).

A worker wraps each phase in :meth:`PhaseMemory.track`; the peaks seen inside the phase are kept
until :meth:`PhaseMemory.pop_metrics` hands them to the step's metrics (GiB):

* with CUDA: ``perf/max_memory_allocated_gb/<phase>`` and ``perf/max_memory_reserved_gb/<phase>``,
  torch's counters of this process. They miss memory other processes hold (an engine core of its own,
  ``rollout.engine_process=true``), and with the engine in this process they include vLLM's sleep-mode
  pool even while the engine sleeps (vLLM unmaps the memory under allocations torch still counts), so
  the phases after a sleep read the pool's size too high; the whole GPU's peak
  (``benchmarks/gpu_peak.py``) is the figure to size a card by;
* on CPU: ``perf/cpu_peak_rss_gb/<phase>`` (the process's peak resident memory during the phase,
  from the kernel's high-water mark ``VmHWM``, reset at the phase start through
  ``/proc/self/clear_refs``) and ``perf/cpu_rss_gb/<phase>`` (resident memory when it ended). On
  CPU-only runs the trainer, actor, reference and rollout engine share one process, so these say
  which phase sets the run's peak. Where ``/proc`` is missing (not Linux) nothing is recorded.

It only measures; the optional CPU heap tuning between phases is :mod:`verl.utils.host_memory`.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

import torch

GIB = 1024 ** 3


def proc_status_kib(*keys: str) -> dict[str, int] | None:
    """``/proc/self/status`` fields (kB) such as ``VmRSS`` and ``VmHWM``; None without procfs."""
    try:
        with open("/proc/self/status") as f:
            text = f.read()
    except OSError:
        return None
    found = {}
    for key in keys:
        match = re.search(rf"^{key}:\s+(\d+)", text, re.MULTILINE)
        if match is None:
            return None
        found[key] = int(match.group(1))
    return found


def reset_peak_rss() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PhaseMemory:
    """Per-phase peak memory of this process (one rank): CUDA allocator stats, else CPU RSS."""

    def __init__(self) -> None:
        self._peaks: dict[str, tuple[float, float]] = {}
        self._names = (("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb") if torch.cuda.is_available()
                       else ("perf/cpu_peak_rss_gb", "perf/cpu_rss_gb"))

    @contextlib.contextmanager
    def track(self, phase: str) -> Iterator[None]:
        """Record the phase's peak (allocated/reserved GiB, or peak/final RSS GiB on CPU)."""
        if not torch.cuda.is_available():
            yield from self._track_cpu(phase)
            return
        torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            self._record(phase, torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB)

    def _track_cpu(self, phase: str) -> Iterator[None]:
        if proc_status_kib("VmRSS", "VmHWM") is None or not reset_peak_rss():
            yield
            return
        try:
            yield
        finally:
            status = proc_status_kib("VmRSS", "VmHWM")
            if status is not None:
                self._record(phase, status["VmHWM"] * 1024 / GIB, status["VmRSS"] * 1024 / GIB)

    def _record(self, phase: str, first: float, second: float) -> None:
        old_first, old_second = self._peaks.get(phase, (0.0, 0.0))
        self._peaks[phase] = (max(first, old_first), max(second, old_second))

    def pop_metrics(self) -> dict[str, float]:
        """The recorded peaks as metrics, then forget them (one report per step)."""
        metrics = {}
        for phase, (first, second) in self._peaks.items():
            metrics[f"{self._names[0]}/{phase}"] = first
            metrics[f"{self._names[1]}/{phase}"] = second
        self._peaks.clear()
        return metrics
