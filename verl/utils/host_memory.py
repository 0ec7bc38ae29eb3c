"""Optional CPU tuning of a worker's glibc heap: trimming between phases, a low mmap threshold in updates.

It changes no values, only how soon freed tensor memory goes back to the OS, which matters when the
trainer, actor, reference and rollout engine share one CPU process: glibc keeps memory that tensors
freed inside its heaps (a phase's activations, the weight-sync copies), so without a trim the process
would carry each phase's leftovers into the next one and the run's peak would creep up step after
step. On a GPU machine, and where glibc is absent, every call is a no-op. The workers get a
:class:`HostMemoryHook` built from ``trainer.host_memory`` and wrap each phase in :meth:`~HostMemoryHook.phase`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from verl.utils.device_memory import GIB, proc_status_kib


@dataclass(frozen=True)
class HostMemoryConfig:
    """CPU-only heap tuning of the worker processes (``trainer.host_memory``)."""

    trim_after_phase: bool = True
    """give freed heap memory back to the OS at the end of each worker phase (`malloc_trim`; reports
    `perf/cpu_heap_trimmed_gb/<phase>`)"""
    update_mmap_threshold_mib: Optional[float] = None
    """e.g. `1`: during the actor update glibc maps every block of at least this many MiB on its own,
    so freed activations and gradients leave at once (lower peak, more page faults); `null`: glibc's
    dynamic threshold"""


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




class HostMemoryHook:
    """The tuning of :class:`HostMemoryConfig` for one worker process (a no-op with a GPU)."""

    def __init__(self, config: HostMemoryConfig | None = None):
        self.config = config or HostMemoryConfig()
        self.enabled = not torch.cuda.is_available()
        self._trimmed: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Trim the heap when the phase ends (``trim_after_phase``), recording the GiB given back."""
        try:
            yield
        finally:
            if self.enabled and self.config.trim_after_phase:
                before = proc_status_kib("VmRSS")
                if trim_host_heap() and before is not None:
                    after = proc_status_kib("VmRSS")
                    freed = max(0, before["VmRSS"] - after["VmRSS"]) * 1024 / GIB if after else 0.0
                    self._trimmed[name] = max(freed, self._trimmed.get(name, 0.0))

    def update(self) -> contextlib.AbstractContextManager:
        """The actor update's mmap threshold (``update_mmap_threshold_mib``), or nothing."""
        mib = self.config.update_mmap_threshold_mib
        return host_mmap_threshold(int(mib * 2**20) if self.enabled and mib else None)

    def pop_metrics(self) -> dict[str, float]:
        """``perf/cpu_heap_trimmed_gb/<phase>`` since the last call."""
        metrics = {f"perf/cpu_heap_trimmed_gb/{name}": gib for name, gib in self._trimmed.items()}
        self._trimmed.clear()
        return metrics
