"""Wall-clock timing of the named phases of a training step (``timing_s/<name>`` metrics)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def timer(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Add the seconds spent inside the block to ``timings[name]``.

    Accumulates rather than overwrites, so a phase entered twice in one step (e.g. generation
    across several turns) reports its total.
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
