"""Dynamic micro-batching: queries of concurrent requests are searched together as one batch.

Search-R1's server encoded and searched each request on its own, so 64 rollout workers asking one
query each paid 64 encoder calls and 64 brute-force scans of the index. Here every request is put on
an asyncio queue; one worker takes everything waiting (up to ``max_batch_queries`` queries, waiting
at most ``max_wait_s`` for more to arrive), runs one encode + one FAISS search in a worker thread,
and hands each request its slice. While a batch runs, the event loop keeps accepting requests, so
under load batches grow by themselves and an idle server adds at most ``max_wait_s`` of latency.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future


@dataclass
class BatchStats:
    """Cumulative counters (seconds) exposed on ``GET /stats`` and read by the benchmark."""

    batches: int = 0
    requests: int = 0
    queries: int = 0
    encode_s: float = 0.0
    search_s: float = 0.0
    rerank_s: float = 0.0
    compute_s: float = 0.0
    max_batch_queries_seen: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "extra"}
        out["mean_batch_queries"] = self.queries / self.batches if self.batches else 0.0
        return out


SearchFn = Callable[[list[str], int, dict], list[list[dict]]]


class MicroBatcher:
    """Collects concurrent ``submit`` calls into batched calls of ``search_fn``.

    Args:
        search_fn: ``(queries, topk, timings) -> per-query hit lists``; runs in one worker thread
            (the encoder and FAISS use their own intra-op threads).
        max_batch_queries: cap on queries per batch; a single larger request is still run whole.
        max_wait_s: how long the worker waits for more requests once it has one.
        batching: False runs each request alone, one at a time (the reference design; the
            benchmark's baseline).
    """

    def __init__(self, search_fn: SearchFn, max_batch_queries: int = 256, max_wait_s: float = 0.002,
                 batching: bool = True):
        self.search_fn = search_fn
        self.max_batch_queries = max_batch_queries
        self.max_wait_s = max_wait_s
        self.batching = batching
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task | None = None
        self._carry: _Pending | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval")

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: list[str], topk: int) -> list[list[dict]]:
        """Search ``queries`` (top ``topk`` each) as part of the next batch."""
        assert self._queue is not None, "MicroBatcher.start() was not awaited"
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(queries, topk, future))
        return await future

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            try:
                await self._process(batch)
            except Exception as err:  # a failed batch fails its requests, never the worker
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(err)

    async def _collect(self) -> list[_Pending]:
        queue = self._queue
        if self._carry is not None:
            batch, self._carry = [self._carry], None
        else:
            batch = [await queue.get()]
        if not self.batching:
            return batch
        size = len(batch[0].queries)
        deadline = time.monotonic() + self.max_wait_s
        while size < self.max_batch_queries:
            if queue.empty():
                # Short sleeps rather than wait_for(queue.get()): on Python 3.11 a timed-out
                # wait_for can drop an item it had already taken from the queue.
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.sleep(min(remaining, 0.0005))
                continue
            item = queue.get_nowait()
            if size + len(item.queries) > self.max_batch_queries:
                self._carry = item  # first in the next batch, so it keeps its place
                break
            batch.append(item)
            size += len(item.queries)
        return batch

    async def _process(self, batch: list[_Pending]) -> None:
        live = [item for item in batch if not item.future.done()]  # skip requests already cancelled
        if not live:
            return
        queries = [q for item in live for q in item.queries]
        topk = max(item.topk for item in live)
        timings: dict = {}
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self._executor, self.search_fn, queries, topk, timings)
        self._record(live, len(queries), timings, time.perf_counter() - start)
        offset = 0
        for item in live:
            part = results[offset:offset + len(item.queries)]
            offset += len(item.queries)
            if not item.future.done():
                item.future.set_result([hits[:item.topk] for hits in part])

    def _record(self, live: list[_Pending], num_queries: int, timings: dict, elapsed: float) -> None:
        stats = self.stats
        stats.batches += 1
        stats.requests += len(live)
        stats.queries += num_queries
        stats.encode_s += timings.get("encode_s", 0.0)
        stats.search_s += timings.get("search_s", 0.0)
        stats.rerank_s += timings.get("rerank_s", 0.0)
        stats.compute_s += elapsed
        stats.max_batch_queries_seen = max(stats.max_batch_queries_seen, num_queries)
