"""The asynchronous rollout: every trajectory is its own asyncio task.

A task generates until a stop string, calls its tool when the turn asked for it, appends the
observation and generates again, with the same per-turn rules as the sync loop
(:class:`~verl.workers.rollout.agent_loop.rules.TurnRules`). Meanwhile the other tasks keep the
engine busy: with vLLM a continuation that is ready joins the running batch at the next scheduler
step (``verl/workers/rollout/async_engine.py``), so no turn waits for the slowest row and a slow
tool call holds up only its own row.

Tool calls go one per trajectory turn through the environment's ``tool_session``, entered on an
event loop of its own thread (:class:`ToolLoop`). At most ``Environment.max_concurrent_calls``
calls are in flight (slime's ``search_concurrency``).

Sampling seeds do not depend on timing: row ``i`` gets ``seeds_per_row`` consecutive seeds from
``first_seed[i]`` (one per turn), so a request's seed is fixed by its row and turn, not by the
order in which requests reach the engine.

When the engine lives in the trainer's rollout workers, this runs there, beside it
(:mod:`~verl.workers.rollout.agent_loop.remote`).
"""

from __future__ import annotations

import asyncio
import contextlib
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
        self._limit: asyncio.Semaphore | None = None
        self._call = None

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
        self._limit = asyncio.Semaphore(self.max_concurrent_calls or len(rows) or 1)
        tools = ToolLoop(self.rules.env)
        try:
            self._call = tools.call
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
                rules.observe(row, await self._tool(action))
            if not row.active:
                break
        if rules.wants_eos(row):
            eos_params = replace(rules.eos_params(params),
                                 seed=None if seed is None else seed + self.config.max_turns + 1)
            rules.accept_eos(row, await self.engine.agenerate(row.context, eos_params))

    async def _tool(self, action: Action) -> Observation:
        async with self._limit:
            self.tool_meter.enter()
            try:
                return await self._call(action)
            finally:
                self.tool_meter.exit()

    def _timing(self, wall_s: float) -> dict[str, float]:
        engine, tools = self.engine.meter.summary(), self.tool_meter.summary()
        return {"rollout_s": wall_s, "generation_s": engine["busy_s"], "tool_s": tools["busy_s"],
                "engine_busy_fraction": engine["busy_fraction"], "mean_requests_in_engine": engine["mean"],
                "mean_tool_calls_in_flight": tools["mean"], "peak_tool_calls_in_flight": tools["peak"]}


class ToolLoop:
    """The environment's tool session on an event loop in a thread of its own.

    The vLLM step driver advances the engine on the rollout's event loop, one scheduler step per
    loop iteration, so on that loop every stage of a tool's HTTP exchange (send, read, parse) would
    wait for an engine step: searches then took seconds and held their trajectories out of the
    engine. Here the session runs on its own loop (its socket waits release the GIL) and the
    rollout's loop sees only the finished result.

    Args:
        env: the environment whose ``tool_session()`` is entered for the rollout.
    """

    def __init__(self, env: Environment) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tool-loop", daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        self._call = asyncio.run_coroutine_threadsafe(self._stack.enter_async_context(env.tool_session()),
                                                      self._loop).result()

    async def call(self, action: Action) -> Observation:
        """The environment's observation for ``action``, awaited on the caller's loop (cancellable)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._call(action), self._loop))

    def close(self) -> None:
        """Leave the tool session (its connection pool) and stop the thread."""
        try:
            asyncio.run_coroutine_threadsafe(self._stack.aclose(), self._loop).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
