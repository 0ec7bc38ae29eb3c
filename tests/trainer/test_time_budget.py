"""``trainer.max_time_s``: which step becomes the last (the arithmetic, on a fake clock)."""

import pytest

from verl.trainer.ppo.time_budget import TimeBudget


class Clock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_no_limit_never_stops():
    budget = TimeBudget(None, clock=Clock(1e9), started=0.0)
    budget.record("step", 1e6)
    assert not budget.last_step(True, True, True, True)
    assert not TimeBudget(0, clock=Clock(1e9), started=0.0).last_step(True, True, True, True)


def test_stops_when_the_next_step_and_the_end_do_not_fit():
    clock = Clock(100.0)
    budget = TimeBudget(200.0, clock=clock, started=0.0)  # deadline at 200: 100 s left
    assert not budget.last_step(True, True, True, True)  # nothing measured yet: the estimates are 0
    for seconds in (50.0, 10.0, 12.0):
        budget.record("step", seconds)
    budget.record("validation", 20.0)
    budget.record("save", 5.0)
    # the slowest of the last three steps (50) + validation and save at the end (25) = 75 <= 100
    assert not budget.last_step(False, False, True, True)
    # a validation and a save due at this step too: 100 s needed, exactly what is left
    assert not budget.last_step(True, True, True, True)
    clock.now = 100.5
    assert budget.last_step(True, True, True, True)
    # only the last three steps count: 50 s falls out of the window
    budget.record("step", 11.0)
    assert not budget.last_step(True, True, True, True)
    # without validation or checkpoint at the end only the next step must fit
    clock.now = 185.0
    assert budget.last_step(False, False, True, False)
    assert not budget.last_step(False, False, False, False)
    assert "15 s left" in budget.explain() and "a step takes up to 12 s" in budget.explain()


def test_unknown_phase_is_named():
    with pytest.raises(ValueError, match="'update'"):
        TimeBudget(10.0, started=0.0).record("update", 1.0)
