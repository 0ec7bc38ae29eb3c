"""``trainer.max_time_s``: a run that must end by a wall-clock limit (a scheduler's job time, a held
machine) ends at a step of its own choosing, validated and checkpointed, instead of being killed
between checkpoints with its last steps and evaluation lost.

The trainer asks :meth:`TimeBudget.last_step` after every step whether one more step, the final
validation and the final checkpoint still fit in what is left; each estimate is the slowest of the
recent measurements of that phase (none measured yet: 0 s, so the first step always runs).
"""

from __future__ import annotations

import time
from collections import deque

import psutil

RECENT = 3  # step durations the next step's estimate looks at (the slowest of them)


class TimeBudget:
    """Seconds left of ``max_time_s`` counted from this process's start, and the phases' durations.

    Args:
        max_time_s: the limit in seconds from the process start (``psutil``'s create time, so the
            start-up of workers and engines counts); None or <= 0: no limit.
        clock: ``time.time``-like; started: the start in the clock's seconds (default: the process's).
    """

    def __init__(self, max_time_s: float | None, clock=time.time, started: float | None = None):
        self.clock = clock
        started = psutil.Process().create_time() if started is None else started
        self.deadline = started + max_time_s if max_time_s and max_time_s > 0 else None
        self.steps: deque[float] = deque(maxlen=RECENT)
        self.validation_s = 0.0
        self.save_s = 0.0

    def record(self, phase: str, seconds: float) -> None:
        """A measured duration: ``phase`` is ``step``, ``validation`` or ``save``.

        Raises:
            ValueError: another phase name.
        """
        if phase == "step":
            self.steps.append(seconds)
        elif phase == "validation":
            self.validation_s = seconds
        elif phase == "save":
            self.save_s = seconds
        else:
            raise ValueError(f"TimeBudget.record: unknown phase {phase!r} (step, validation, save)")

    def last_step(self, validates_now: bool, saves_now: bool, validates_at_end: bool, saves_at_end: bool) -> bool:
        """Whether the step just finished must be the run's last: after this step's own validation
        and checkpoint (``*_now``), one more step and the end's validation and checkpoint
        (``*_at_end``) would not fit in the time left."""
        if self.deadline is None:
            return False
        need = (self.validation_s * (validates_now + validates_at_end) + self.save_s * (saves_now + saves_at_end)
                + max(self.steps, default=0.0))
        return self.clock() + need > self.deadline

    def explain(self) -> str:
        """One line for the log: the time left and the estimates behind the decision."""
        left = self.deadline - self.clock() if self.deadline is not None else float("inf")
        return (f"{left:.0f} s left of trainer.max_time_s; a step takes up to {max(self.steps, default=0.0):.0f} s, "
                f"a validation {self.validation_s:.0f} s, a checkpoint {self.save_s:.0f} s")
