"""The asynchronous rollout: every trajectory is its own asyncio task.

A task generates until a stop string, calls its tool when the turn asked for it, appends the
observation and generates again, with the same per-turn rules as the sync loop
(:class:`~verl.workers.rollout.agent_loop.rules.TurnRules`). Meanwhile the other tasks keep the
engine busy: with vLLM a continuation that is ready joins the running batch at the next scheduler
step (``verl/workers/rollout/async_engine.py``), so no turn waits for the slowest row and a slow
tool call holds up only its own row.

A trajectory's tool call joins the others made in the same event-loop iteration (the tasks that
one engine step finished) and they go together, as one batch, through the environment's
``tool_session`` on an event loop of its own thread (:class:`ToolLoop`): one retriever request
for many searches, as in the sync loop, instead of one request each. At most
``Environment.max_concurrent_calls`` calls are in flight (slime's ``search_concurrency``); calls
made while the cap is reached wait and go in the next batch.

Sampling seeds do not depend on timing: row ``i`` gets ``seeds_per_row`` consecutive seeds from
``first_seed[i]`` (one per turn), so a request's seed is fixed by its row and turn, not by the
order in which requests reach the engine.

When the engine lives in the trainer's rollout workers, this runs there, beside it
(:mod:`~verl.workers.rollout.agent_loop.remote`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from dataclasses import replace

from verl.envs.base import Action, Environment, Observation
from verl.workers.rollout.agent_loop.rules import TurnRules
from verl.workers.rollout.agent_loop.trajectory import Trajectory
from verl.workers.rollout.async_engine import AsyncEngine, BusyMeter
from verl.workers.rollout.base import SamplingParams


class AsyncRollout:
    """Runs the rows of one batch as concurrent tasks.

    Args:
        rules: the :class:`TurnRules` (tokenizer, environment, budgets).
        engine: an ``AsyncEngine`` (``verl.workers.rollout.async_engine.async_engine(engine)``).
        max_concurrent_calls: tool calls in flight at most (0: one per row).
    """

    def __init__(self, rules: TurnRules, engine: AsyncEngine, max_concurrent_calls: int = 0) -> None:
        self.rules, self.engine, self.max_concurrent_calls = rules, engine, max_concurrent_calls
        self.config = rules.config
        self.tool_meter = BusyMeter()
        self._tools: ToolLoop | None = None

    async def run(self, rows: list[Trajectory], params: SamplingParams,
                  first_seed: list[int] | None) -> dict[str, float]:
        """Roll out ``rows`` in place; returns the timing and concurrency figures (seconds, counts).

        Raises:
            the first error of any task (a tool that failed for good, an engine error); the
            other tasks are cancelled and the engine drops their requests.
        """
        start = time.perf_counter()
        self.engine.meter = BusyMeter()
        self.tool_meter = BusyMeter()
        tools = ToolLoop(self.rules.env, self.max_concurrent_calls, self.tool_meter)
        try:
            self._tools = tools
            tasks = [asyncio.ensure_future(self._trajectory(row, params, None if first_seed is None else first_seed[i]))
                     for i, row in enumerate(rows)]
            try:
                await asyncio.gather(*tasks)
            except BaseException as err:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self.engine.close(err if isinstance(err, Exception) else None)
                raise
        finally:
            tools.close()
        return self._timing(time.perf_counter() - start)

    async def _trajectory(self, row: Trajectory, params: SamplingParams, seed: int | None) -> None:
        rules = self.rules
        for turn in range(self.config.max_turns + 1):
            turn_params = replace(params, max_tokens=min(params.max_tokens, rules.turn_budget(row)),
                                  seed=None if seed is None else seed + turn)
            out = await self.engine.agenerate(row.context, turn_params)
            action = rules.apply_generation(row, out, final=turn == self.config.max_turns)
            if not row.active:
                break
            if action is not None and action.kind == "call":
                rules.observe(row, await self._tools.call(action))
            if not row.active:
                break
        if rules.wants_eos(row):
            eos_params = replace(rules.eos_params(params),
                                 seed=None if seed is None else seed + self.config.max_turns + 1)
            rules.accept_eos(row, await self.engine.agenerate(row.context, eos_params))

    def _timing(self, wall_s: float) -> dict[str, float]:
        engine, tools = self.engine.meter.summary(), self.tool_meter.summary()
        return {"rollout_s": wall_s, "generation_s": engine["busy_s"], "tool_s": tools["busy_s"],
                "engine_busy_fraction": engine["busy_fraction"], "mean_requests_in_engine": engine["mean"],
                "mean_tool_calls_in_flight": tools["mean"], "peak_tool_calls_in_flight": tools["peak"]}


class ToolLoop:
    """The environment's tool session on an event loop in a thread of its own, fed in batches.

    The vLLM step driver advances the engine on the rollout's event loop, one scheduler step per
    loop iteration, so on that loop every stage of a tool's HTTP exchange (send, read, parse) would
    wait for an engine step; here the session runs on its own loop (its socket waits release the
    GIL) and the rollout's loop sees only the finished results. Calls are batched because every
    request costs interpreter time that the engine's front end and the rollout's tasks share
    (docs/benchmarks.md, Asynchronous rollout: one search per request kept hundreds waiting).

    Args:
        env: the environment whose ``tool_session()`` (batched) is entered for the rollout.
        max_calls_in_flight: calls sent and not yet answered, at most (0: no cap).
        meter: counts the calls in flight (``enter`` / ``exit`` per call).
    """

    def __init__(self, env: Environment, max_calls_in_flight: int = 0, meter: BusyMeter | None = None) -> None:
        self.max_calls_in_flight, self.meter = max_calls_in_flight, meter or BusyMeter()
        self._pending: list[tuple[Action, asyncio.Future]] = []
        self._in_flight = 0
        self._flush_scheduled = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tool-loop", daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        self._call = asyncio.run_coroutine_threadsafe(self._stack.enter_async_context(env.tool_session()),
                                                      self._loop).result()

    async def call(self, action: Action) -> Observation:
        """The environment's observation for ``action``, awaited on the caller's loop (cancellable).
        It is sent with the other calls of this loop iteration, or of the iterations the cap held back.

        Raises:
            the tool's error for the batch it went in (the tool failed for good).
        """
        future = asyncio.get_running_loop().create_future()
        self._pending.append((action, future))
        self._schedule_flush()
        return await future

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)  # after the calls of this iteration

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._pending = [(action, future) for action, future in self._pending if not future.done()]
        room = (self.max_calls_in_flight - self._in_flight) if self.max_calls_in_flight else len(self._pending)
        if room <= 0 or not self._pending:
            return
        batch, self._pending = self._pending[:room], self._pending[room:]
        self._in_flight += len(batch)
        for _ in batch:
            self.meter.enter()
        sent = asyncio.run_coroutine_threadsafe(self._call([action for action, _ in batch]), self._loop)
        asyncio.wrap_future(sent).add_done_callback(functools.partial(self._answer, batch))

    def _answer(self, batch: list[tuple[Action, asyncio.Future]], done: asyncio.Future) -> None:
        self._in_flight -= len(batch)
        for _ in batch:
            self.meter.exit()
        error = None if done.cancelled() else done.exception()
        if not done.cancelled() and error is None and len(done.result()) != len(batch):
            error = RuntimeError(f"environment answered {len(done.result())} of {len(batch)} tool calls")
        for i, (_, future) in enumerate(batch):
            if future.done():  # its task was cancelled
                continue
            if done.cancelled():
                future.cancel()
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(done.result()[i])
        if self._pending:
            self._schedule_flush()

    def close(self) -> None:
        """Leave the tool session (its connection pool) and stop the thread."""
        try:
            asyncio.run_coroutine_threadsafe(self._stack.aclose(), self._loop).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
