"""Peak memory per phase of a step (generation, log-probs, updates).

A worker wraps each phase in :meth:`PhaseMemory.track`; the peaks seen inside the phase are kept
until :meth:`PhaseMemory.pop_metrics` hands them to the step's metrics (GiB):

* with CUDA: ``perf/max_memory_allocated_gb/<phase>`` and ``perf/max_memory_reserved_gb/<phase>``;
* on CPU: ``perf/cpu_peak_rss_gb/<phase>`` (the process's peak resident memory during the phase,
  from the kernel's high-water mark ``VmHWM``, reset at the phase start through
  ``/proc/self/clear_refs``) and ``perf/cpu_rss_gb/<phase>`` (resident memory when it ended). On
  CPU-only runs the trainer, actor, reference and rollout engine share one process, so these say
  which phase sets the run's peak. Where ``/proc`` is missing (not Linux) nothing is recorded.

On CPU each phase also ends with :func:`trim_host_heap`: glibc keeps memory that tensors freed
inside its heaps (the phase's activations, the weight-sync copies), so without it the process
would carry each phase's leftovers into the next one and the run's peak would creep up step after
step. ``perf/cpu_heap_trimmed_gb/<phase>`` is the resident memory the trim gave back.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import re
from typing import Iterator

import torch

GIB = 1024 ** 3


def _proc_status_kib(*keys: str) -> dict[str, int] | None:
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


_LIBC = None


def trim_host_heap() -> bool:
    """Give the free memory of glibc's heaps back to the OS (``malloc_trim(0)``); False if no glibc.

    Tensors smaller than glibc's mmap threshold (which rises to 32 MiB once such a block is freed)
    live in malloc's heaps; when freed, their pages stay resident unless they sit at a heap's top.
    ``malloc_trim`` releases every whole free page of every arena (``madvise(MADV_DONTNEED)``), so
    the process's RSS drops back to what it still uses. Costs milliseconds; changes no values.
    """
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc else None
    if trim is None:  # musl, macOS: no malloc_trim
        return False
    trim(0)
    return True


_M_MMAP_THRESHOLD = -3  # mallopt parameter number (malloc.h)
GLIBC_MAX_MMAP_THRESHOLD = 32 << 20  # the ceiling of glibc's dynamic threshold on 64-bit


def _libc():
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name) if name else False
        except OSError:
            _LIBC = False
    return _LIBC


@contextlib.contextmanager
def host_mmap_threshold(threshold_bytes: int | None) -> Iterator[bool]:
    """Inside the block, glibc gives each block of >= ``threshold_bytes`` its own mapping.

    A mapped block goes back to the OS the moment it is freed, so a phase that allocates and frees
    gigabytes of differently sized tensors (an actor update: activations, their gradients, the
    parameter gradients) cannot leave its peak inflated by heap fragmentation. The price is a fresh
    zero-filled page per 4 KiB on every allocation (page faults), so it is used for the update only.
    After the block the threshold is set to glibc's 32 MiB ceiling, where its dynamic threshold
    would be by then anyway (the dynamic adjustment stays off: mallopt fixes the threshold). Yields
    whether it applied (glibc only; ``threshold_bytes`` falsy: a no-op). Changes no values.
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc else None
    if not threshold_bytes or mallopt is None:
        yield False
        return
    mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes))
    try:
        yield True
    finally:
        mallopt(_M_MMAP_THRESHOLD, GLIBC_MAX_MMAP_THRESHOLD)


class PhaseMemory:
    """Per-phase peak memory of this process (one rank): CUDA allocator stats, else CPU RSS."""

    def __init__(self) -> None:
        self._peaks: dict[str, tuple[float, float]] = {}
        self._trimmed: dict[str, float] = {}  # CPU: GiB given back by the phase-end heap trim
        self._names = (("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb") if torch.cuda.is_available()
                       else ("perf/cpu_peak_rss_gb", "perf/cpu_rss_gb"))

    @contextlib.contextmanager
    def track(self, phase: str) -> Iterator[None]:
        """Record the phase's peak (allocated/reserved GiB, or peak/final RSS GiB on CPU, after a heap trim)."""
        if not torch.cuda.is_available():
            yield from self._track_cpu(phase)
            return
        torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            self._record(phase, torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB)

    def _track_cpu(self, phase: str) -> Iterator[None]:
        if _proc_status_kib("VmRSS", "VmHWM") is None or not reset_peak_rss():
            yield
            return
        try:
            yield
        finally:
            before = _proc_status_kib("VmRSS", "VmHWM")
            trim_host_heap()
            status = _proc_status_kib("VmRSS", "VmHWM")
            if status is not None and before is not None:
                self._record(phase, status["VmHWM"] * 1024 / GIB, status["VmRSS"] * 1024 / GIB)
                trimmed = max(0, before["VmRSS"] - status["VmRSS"]) * 1024 / GIB
                self._trimmed[phase] = max(trimmed, self._trimmed.get(phase, 0.0))

    def _record(self, phase: str, first: float, second: float) -> None:
        old_first, old_second = self._peaks.get(phase, (0.0, 0.0))
        self._peaks[phase] = (max(first, old_first), max(second, old_second))

    def pop_metrics(self) -> dict[str, float]:
        """The recorded peaks as metrics, then forget them (one report per step)."""
        metrics = {}
        for phase, (first, second) in self._peaks.items():
            metrics[f"{self._names[0]}/{phase}"] = first
            metrics[f"{self._names[1]}/{phase}"] = second
        for phase, trimmed in self._trimmed.items():
            metrics[f"perf/cpu_heap_trimmed_gb/{phase}"] = trimmed
        self._peaks.clear()
        self._trimmed.clear()
        return metrics
