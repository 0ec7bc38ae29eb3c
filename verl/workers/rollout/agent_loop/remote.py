"""The agent loop sent to the rollout workers, and its per-turn progress sent back.

When the engine lives in the trainer's rollout workers, the controller does not drive it turn by
turn: it sends the rows with an :class:`AgentLoop` (loop config, environment, sampling parameters;
picklable, no open connection) and every worker runs the whole multi-turn rollout of its rows
beside its own engine, in either mode (``sync``: Search-R1's turn loop over the worker's rows;
``async``: one task per row). Nothing crosses the process boundary per turn except, when the
caller wants it (validation's progress bar), one small progress record per worker and turn.

Progress: each worker puts ``(worker_id, TurnProgress)`` on a sink (:meth:`AgentLoop.progress`);
:class:`TurnAggregator` turns the latest record of every worker into one ``TurnProgress`` of the
whole batch. In one process the sink calls the aggregator directly (:class:`DirectSink`); across
Ray processes it is a ``ray.util.queue.Queue`` drained by a thread of the controller
(:func:`drain_while`).
"""

from __future__ import annotations

import copy
import math
import os
import queue as queues
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable

from verl.envs.base import Environment
from verl.workers.rollout.agent_loop.rules import LoopConfig
from verl.workers.rollout.base import SamplingParams


@dataclass
class AgentLoop:
    """The multi-turn rollout of a batch's rows, sent to the rollout workers with those rows.

    The controller builds it (``MultiTurnRollout`` over the trainer's worker group); each worker
    calls it with its own engine and tokenizer on its chunk of rows. The environment travels with it
    (a tool client holds plain settings, no open connection).

    Attributes:
        config: the ``LoopConfig`` (either mode).
        env: the environment.
        params: the turn's sampling parameters (stop strings already set).
        progress: where each turn's ``(worker id, TurnProgress)`` goes (anything with ``put``), or None.
    """

    config: LoopConfig
    env: Environment
    params: SamplingParams
    progress: Any = None

    def for_workers(self, num_workers: int) -> "AgentLoop":
        """This loop with the tool-call cap split over ``num_workers`` (so the whole run keeps
        ``Environment.max_concurrent_calls`` calls in flight at most, rounded up per worker)."""
        cap = self.env.max_concurrent_calls
        if not cap or num_workers <= 1:
            return self
        env = copy.copy(self.env)
        env.max_concurrent_calls = max(1, math.ceil(cap / num_workers))
        return replace(self, env=env)

    def __call__(self, engine, tokenizer, data):
        """Roll out ``data``'s rows (``raw_prompt_ids``, optional ``rollout_seed``) on ``engine``."""
        from verl.workers.rollout.agent_loop.loop import MultiTurnRollout

        on_turn = None
        if self.progress is not None:
            worker = os.getpid()
            on_turn = lambda turn: self.progress.put((worker, turn))  # noqa: E731
        env = self.env.bind(tokenizer)  # it travels without one
        return MultiTurnRollout(tokenizer, engine, env, self.config).run(data, self.params, on_turn=on_turn)


class TurnAggregator:
    """One batch-wide ``TurnProgress`` from every worker's latest: turns the furthest worker's, rows
    and active rows summed over the workers heard from (a worker not heard from has ended no row).

    Args:
        on_turn: called with each aggregated ``TurnProgress``.
    """

    def __init__(self, on_turn: Callable) -> None:
        self.on_turn = on_turn
        self.latest: dict[Any, Any] = {}

    def __call__(self, worker, progress) -> None:
        from verl.workers.rollout.agent_loop.loop import TurnProgress

        self.latest[worker] = progress
        seen = self.latest.values()
        self.on_turn(TurnProgress(turn=max(p.turn for p in seen), max_turns=progress.max_turns,
                                  rows=sum(p.rows for p in seen), active=sum(p.active for p in seen)))


class DirectSink:
    """A progress sink in the caller's own process (``trainer.backend=local``): ``put`` aggregates."""

    def __init__(self, aggregator: TurnAggregator) -> None:
        self.aggregator = aggregator

    def put(self, item) -> None:
        self.aggregator(*item)


def drain_while(call: Callable[[], Any], queue, aggregator: TurnAggregator, poll_s: float = 0.2) -> Any:
    """``call()`` on this thread while a second thread feeds ``queue``'s items (``get(timeout=)``
    raising ``queue.Empty`` on timeout, as ``ray.util.queue.Queue`` does) to ``aggregator``; items left when the call
    returns are fed before this returns. Returns what ``call`` returned; its error propagates."""
    done = threading.Event()

    def feed(block: bool) -> bool:
        try:
            item = queue.get(timeout=poll_s) if block else queue.get_nowait()
        except queues.Empty:  # ray.util.queue.Empty is one too
            return False
        aggregator(*item)
        return True

    def pump() -> None:
        while not done.is_set():
            feed(block=True)

    thread = threading.Thread(target=pump, name="rollout-progress", daemon=True)
    thread.start()
    try:
        return call()
    finally:
        done.set()
        thread.join()
        while feed(block=False):
            pass
