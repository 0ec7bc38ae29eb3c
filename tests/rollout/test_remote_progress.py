"""The progress of a loop run in the workers: every worker's latest turn summed, fed while the call runs."""

from __future__ import annotations

import queue
import threading

import pytest

from verl.workers.rollout.agent_loop import TurnProgress
from verl.workers.rollout.agent_loop.remote import DirectSink, TurnAggregator, drain_while


def test_aggregator_sums_the_latest_turn_of_every_worker():
    seen = []
    aggregate = TurnAggregator(seen.append)
    aggregate("a", TurnProgress(turn=1, max_turns=3, rows=4, active=3))
    aggregate("b", TurnProgress(turn=1, max_turns=3, rows=2, active=2))
    aggregate("a", TurnProgress(turn=2, max_turns=3, rows=4, active=1))
    assert seen == [TurnProgress(1, 3, 4, 3), TurnProgress(1, 3, 6, 5), TurnProgress(2, 3, 6, 3)]
    DirectSink(aggregate).put(("b", TurnProgress(turn=3, max_turns=3, rows=2, active=0)))
    assert seen[-1] == TurnProgress(3, 3, 6, 1)


def test_drain_while_feeds_items_during_and_after_the_call():
    items, seen = queue.Queue(), []
    aggregate = TurnAggregator(seen.append)
    fed_during = threading.Event()
    aggregate_during = TurnAggregator(lambda p: (seen.append(p), fed_during.set()))

    def call():  # a worker's two turns: the first is seen before the call returns
        items.put(("w", TurnProgress(1, 2, 3, 2)))
        assert fed_during.wait(120), "the first turn was not fed while the call ran"  # a hang guard, not a timing
        items.put(("w", TurnProgress(2, 2, 3, 0)))  # left for the final drain, or fed by the thread
        return "trajectories"

    assert drain_while(call, items, aggregate_during, poll_s=0.05) == "trajectories"
    assert seen == [TurnProgress(1, 2, 3, 2), TurnProgress(2, 2, 3, 0)] and items.empty()
    with pytest.raises(RuntimeError, match="engine failed"):  # the call's error propagates, the thread ends
        drain_while(lambda: (_ for _ in ()).throw(RuntimeError("engine failed")), items, aggregate, poll_s=0.05)
    assert not any(t.name == "rollout-progress" for t in threading.enumerate())
