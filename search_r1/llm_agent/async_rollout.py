"""The asynchronous rollout: every trajectory is its own asyncio task.

A task generates until a stop string, searches when the turn asked for it, appends the
observation and generates again, with the same per-turn rules as the sync loop
(``LLMGenerationManager.apply_generation`` / ``observe_search`` / ``accept_eos``: budgets, stop
strings, invalid actions, the final search-free turn, the EOS-closing token). Meanwhile the other
tasks keep the engine busy: with vLLM a continuation that is ready joins the running batch at the
next scheduler step (``verl/workers/rollout/async_engine.py``), so no turn waits for the slowest
row and a slow search holds up only its own row.

Searches go one query per request through the retriever client, on an event loop of their own
thread (``SearchLoop``); the server's micro-batcher gathers the queries that arrive together. At most ``retriever.max_concurrency`` searches are in
flight (slime's ``search_concurrency``); each has the client's timeout and retries.

Sampling seeds do not depend on timing: row ``i`` gets ``seed_per_row`` consecutive seeds from
``first_seed[i]`` (one per turn), so a request's seed is fixed by its row and turn, not by the
order in which requests reach the engine.

``AgentLoop`` is the same rollout packed for the trainer's rollout workers: the controller sends
it with the rows, each worker runs it beside its own engine (``generate_trajectories``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from search_r1.llm_agent.trajectory import Trajectory
from verl.workers.rollout.async_engine import AsyncEngine, BusyMeter
from verl.workers.rollout.base import SamplingParams


class AsyncRollout:
    """Runs the rows of one batch as concurrent tasks.

    Args:
        manager: the ``LLMGenerationManager`` whose config and per-turn rules apply.
        engine: an ``AsyncEngine`` (``verl.workers.rollout.async_engine.async_engine(engine)``).
        retriever: the manager's retriever (``aretrieve``, or a blocking ``retrieve`` run in a thread).
    """

    def __init__(self, manager, engine: AsyncEngine, retriever) -> None:
        self.manager, self.engine, self.retriever = manager, engine, retriever
        self.config = manager.config
        self.search_meter = BusyMeter()
        self._limit: asyncio.Semaphore | None = None
        self._search = None

    async def run(self, rows: list[Trajectory], params: SamplingParams,
                  first_seed: list[int] | None) -> dict[str, float]:
        """Roll out ``rows`` in place; returns the timing and concurrency figures (seconds, counts).

        Raises:
            the first error of any task (a retriever that failed for good, an engine error); the
            other tasks are cancelled and the engine drops their requests.
        """
        start = time.perf_counter()
        self.engine.meter = BusyMeter()
        self.search_meter = BusyMeter()
        self._limit = asyncio.Semaphore(getattr(self.retriever, "max_concurrency", 0) or len(rows) or 1)
        async with self._search_session() as search:
            self._search = search
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
        return self._timing(time.perf_counter() - start)

    async def _trajectory(self, row: Trajectory, params: SamplingParams, seed: int | None) -> None:
        manager = self.manager
        for turn in range(self.config.max_turns + 1):
            turn_params = replace(params, max_tokens=min(params.max_tokens, manager.turn_budget(row)),
                                  seed=None if seed is None else seed + turn)
            out = await self.engine.agenerate(row.context, turn_params)
            action = manager.apply_generation(row, out, final=turn == self.config.max_turns)
            if not row.active:
                break
            if action is not None and action.kind == "search":
                manager.observe_search(row, await self._retrieve(action.content))
            if not row.active:
                break
        if manager.wants_eos(row):
            eos_params = replace(manager.eos_params(params),
                                 seed=None if seed is None else seed + self.config.max_turns + 1)
            manager.accept_eos(row, await self.engine.agenerate(row.context, eos_params))

    async def _retrieve(self, query: str) -> list[dict]:
        if not self.config.do_search:
            return []
        async with self._limit:
            self.search_meter.enter()
            try:
                results = await self._search([query])
            finally:
                self.search_meter.exit()
        if len(results) != 1:
            raise RuntimeError(f"retriever returned {len(results)} result lists for 1 query")
        return results[0]

    @contextlib.asynccontextmanager
    async def _search_session(self):
        """The retriever's call for this rollout. An async client (``aretrieve``) runs on a
        :class:`SearchLoop` of its own thread; a blocking ``retrieve`` runs in worker threads."""
        retriever = self.retriever
        if retriever is None:
            yield None
        elif hasattr(retriever, "aretrieve"):
            searches = SearchLoop(retriever)
            try:
                yield searches.search
            finally:
                searches.close()
        else:
            async def search(queries):
                return await asyncio.to_thread(retriever.retrieve, queries)
            yield search

    def _timing(self, wall_s: float) -> dict[str, float]:
        engine, search = self.engine.meter.summary(), self.search_meter.summary()
        return {"rollout_s": wall_s, "generation_s": engine["busy_s"], "retrieval_s": search["busy_s"],
                "engine_busy_fraction": engine["busy_fraction"], "mean_requests_in_engine": engine["mean"],
                "mean_searches_in_flight": search["mean"], "peak_searches_in_flight": search["peak"]}


class SearchLoop:
    """The retriever client's HTTP traffic on an event loop in a thread of its own.

    The vLLM step driver advances the engine on the rollout's event loop, one scheduler step per
    loop iteration, so on that loop every stage of an HTTP exchange (send, read, parse) would wait
    for an engine step: searches then took seconds and held their trajectories out of the engine.
    Here the exchange runs on its own loop (its socket waits release the GIL) and the rollout's
    loop sees only the finished result. One connection pool (``session()`` when the client has it)
    serves every search of the rollout.

    Args:
        retriever: a client with ``aretrieve(queries)`` (and optionally ``session()``).
    """

    def __init__(self, retriever) -> None:
        self.retriever = retriever
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="search-loop", daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        self._call = asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    async def _open(self):
        if hasattr(self.retriever, "session"):
            return await self._stack.enter_async_context(self.retriever.session())
        return self.retriever.aretrieve

    async def search(self, queries: list[str]) -> list[list[dict]]:
        """The client's results for ``queries``, awaited on the caller's loop (cancellable)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._call(queries), self._loop))

    def close(self) -> None:
        """Close the connection pool and stop the thread."""
        try:
            asyncio.run_coroutine_threadsafe(self._stack.aclose(), self._loop).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()


@dataclass
class AgentLoop:
    """The async rollout of a batch's rows, sent to the rollout workers with those rows.

    The controller builds it (``LLMGenerationManager`` in async mode over the trainer's worker
    group); each worker calls it with its own engine and tokenizer on its chunk of rows, so the
    trajectory tasks run beside the engine they drive. The retriever client travels with it (plain
    settings, no open connection).

    Attributes:
        config: the ``GenerationConfig`` (mode ``async``).
        retriever: the retriever client, or None without search.
        params: the turn's sampling parameters (stop strings already set).
    """

    config: Any
    retriever: Any
    params: SamplingParams

    def for_workers(self, num_workers: int) -> "AgentLoop":
        """This loop with the search cap split over ``num_workers`` (so the whole run keeps
        ``retriever.max_concurrency`` searches in flight at most, rounded up per worker)."""
        retriever = self.retriever
        if retriever is not None and getattr(retriever, "max_concurrency", None) and num_workers > 1:
            retriever = copy.copy(retriever)
            retriever.max_concurrency = max(1, math.ceil(retriever.max_concurrency / num_workers))
        return replace(self, retriever=retriever)

    def __call__(self, engine, tokenizer, data):
        """Roll out ``data``'s rows (``raw_prompt_ids``, optional ``rollout_seed``) on ``engine``."""
        from search_r1.llm_agent.generation import LLMGenerationManager

        manager = LLMGenerationManager(tokenizer, engine, self.config, self.retriever)
        return manager.run_llm_loop(data, self.params)
