"""Peak accelerator memory per phase of a step (generation, log-probs, updates).

A worker wraps each phase in :meth:`PhaseMemory.track`; the peak allocated and reserved bytes seen
inside the phase are kept until :meth:`PhaseMemory.pop_metrics` hands them to the step's metrics as
``perf/max_memory_allocated_gb/<phase>`` and ``perf/max_memory_reserved_gb/<phase>`` (GiB). Without
CUDA it records nothing: CPU runs report RSS elsewhere and the tracker costs nothing.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

GIB = 1024 ** 3


class PhaseMemory:
    """Per-phase CUDA peak memory of this process (one rank)."""

    def __init__(self) -> None:
        self._peaks: dict[str, tuple[float, float]] = {}

    @contextlib.contextmanager
    def track(self, phase: str) -> Iterator[None]:
        """Record the peak allocated/reserved GiB while the block runs (max over repeated calls)."""
        if not torch.cuda.is_available():
            yield
            return
        torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            allocated = torch.cuda.max_memory_allocated() / GIB
            reserved = torch.cuda.max_memory_reserved() / GIB
            old_allocated, old_reserved = self._peaks.get(phase, (0.0, 0.0))
            self._peaks[phase] = (max(allocated, old_allocated), max(reserved, old_reserved))

    def pop_metrics(self) -> dict[str, float]:
        """The recorded peaks as metrics, then forget them (one report per step)."""
        metrics = {}
        for phase, (allocated, reserved) in self._peaks.items():
            metrics[f"perf/max_memory_allocated_gb/{phase}"] = allocated
            metrics[f"perf/max_memory_reserved_gb/{phase}"] = reserved
        self._peaks.clear()
        return metrics
