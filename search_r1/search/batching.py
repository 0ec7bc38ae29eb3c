"""Dynamic micro-batching: queries of concurrent requests are searched together, large requests in
chunks that share each micro-batch with everyone else's queries.

Search-R1's server encoded and searched each request on its own, so 64 rollout workers asking one
query each paid 64 encoder calls and 64 brute-force scans of the index. Here every request is put on
an asyncio queue; one worker forms a micro-batch of at most ``max_batch_queries`` queries from the
requests waiting (waiting at most ``max_wait_s`` for more once it has one), runs one encode + one
search in a worker thread, and hands each request its slice. While a batch runs, the event loop
keeps accepting requests, so under load batches grow by themselves and an idle server adds at most
``max_wait_s`` of latency.

Fair sharing (:func:`fair_shares`): a request is not searched whole when it is large. Each
micro-batch gives every waiting request, in arrival order, up to an equal quantum of
``max_batch_queries // callers`` queries, where ``callers`` is the number of requests waiting or in
the previous micro-batch, whichever is larger. The previous batch counts because closed-loop callers
answered by it are about to send their next request: counting only who waits at that instant would
hand a 500-query request a whole 256-query batch whenever the small callers are between requests.
Room a small request leaves is not given to a large one, so micro-batches stay short while others
are about; a request alone gets whole micro-batches. Each query's hits depend only on the query, not
on the batch it rides in (up to the encoder's float rounding across batch shapes), so a split
request gets what an unsplit search would give it.
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
    results: list = field(default_factory=list)  # hit lists of the queries searched so far, in order
    parts: int = 0  # micro-batches that carried some of its queries

    @property
    def remaining(self) -> int:
        return len(self.queries) - len(self.results)


@dataclass
class BatchStats:
    """Cumulative counters (seconds) exposed on ``GET /stats`` and read by the benchmark.

    ``requests`` counts answered requests, ``split_requests`` those answered over more than one
    micro-batch; ``max_batch_queries_seen`` is the largest micro-batch so far.
    """

    batches: int = 0
    requests: int = 0
    split_requests: int = 0
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


def fair_shares(remaining: list[int], capacity: int, callers: int) -> list[int]:
    """How many of its queries each waiting request puts into the next micro-batch.

    Args:
        remaining: queries not yet searched, per waiting request, in arrival order.
        capacity: most queries in a micro-batch (``max_batch_queries``).
        callers: requests sharing the server (at least ``len(remaining)`` makes sense; more keeps
            the shares small for callers about to come back).
    Returns:
        one count per request, each at most ``max(1, capacity // callers)``, summing to at most
        ``capacity``; requests late in the order get 0 when the batch is full.
    """
    quantum = max(1, capacity // max(1, callers))
    shares = []
    for left in remaining:
        share = min(left, quantum, capacity)
        shares.append(share)
        capacity -= share
    return shares


class MicroBatcher:
    """Collects concurrent ``submit`` calls into batched calls of ``search_fn``.

    Args:
        search_fn: ``(queries, topk, timings) -> per-query hit lists``; runs in one worker thread
            (the encoder and FAISS use their own intra-op threads).
        max_batch_queries: cap on queries per micro-batch; larger requests are split across
            micro-batches (see the module docstring).
        max_wait_s: how long the worker waits for more requests once it has one.
        batching: False runs each request alone and whole, one at a time (the reference design; the
            benchmark's baseline).
    """

    def __init__(self, search_fn: SearchFn, max_batch_queries: int = 256, max_wait_s: float = 0.002,
                 batching: bool = True):
        if max_batch_queries < 1:
            raise ValueError(f"--max_batch_queries must be >= 1, got {max_batch_queries}")
        self.search_fn = search_fn
        self.max_batch_queries = max_batch_queries
        self.max_wait_s = max_wait_s
        self.batching = batching
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task | None = None
        self._active: list[_Pending] = []  # requests with queries left, in arrival order
        self._last_callers = 0  # requests in the previous micro-batch
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval")

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: list[str], topk: int) -> list[list[dict]]:
        """Search ``queries`` (top ``topk`` each) in the next micro-batches; one hit list per query."""
        assert self._queue is not None, "MicroBatcher.start() was not awaited"
        if not queries:
            return []
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(list(queries), topk, future))
        return await future

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            try:
                await self._process(batch)
            except Exception as err:  # a failed batch fails its requests, never the worker
                for item, _ in batch:
                    if not item.future.done():
                        item.future.set_exception(err)
            self._active = [item for item in self._active if not item.future.done()]

    def _take_waiting(self) -> None:
        """Move queued requests to the active list; drop requests whose caller went away."""
        while not self._queue.empty():
            self._active.append(self._queue.get_nowait())
        self._active = [item for item in self._active if not item.future.done()]

    async def _collect(self) -> list[tuple[_Pending, int]]:
        """The next micro-batch: ``(request, number of its next queries)`` pairs."""
        self._take_waiting()
        while not self._active:
            self._active.append(await self._queue.get())
            self._take_waiting()
        if not self.batching:
            first = self._active[0]
            return [(first, first.remaining)]
        deadline = time.monotonic() + self.max_wait_s
        while True:
            callers = max(len(self._active), self._last_callers)
            shares = fair_shares([item.remaining for item in self._active], self.max_batch_queries, callers)
            if sum(shares) >= self.max_batch_queries or time.monotonic() >= deadline:
                break
            if self._queue.empty():
                # Short sleeps rather than wait_for(queue.get()): on Python 3.11 a timed-out
                # wait_for can drop an item it had already taken from the queue.
                await asyncio.sleep(min(deadline - time.monotonic(), 0.0005))
                continue
            self._take_waiting()
        return [(item, share) for item, share in zip(self._active, shares) if share]

    async def _process(self, batch: list[tuple[_Pending, int]]) -> None:
        queries = [q for item, share in batch for q in item.queries[len(item.results):len(item.results) + share]]
        topk = max(item.topk for item, _ in batch)
        timings: dict = {}
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self._executor, self.search_fn, queries, topk, timings)
        self._record(len(queries), timings, time.perf_counter() - start)
        self._last_callers = len(batch)
        offset = 0
        for item, share in batch:
            item.results.extend(hits[:item.topk] for hits in results[offset:offset + share])
            item.parts += 1
            offset += share
            if not item.remaining and not item.future.done():
                item.future.set_result(item.results)
                self.stats.requests += 1
                self.stats.split_requests += item.parts > 1

    def _record(self, num_queries: int, timings: dict, elapsed: float) -> None:
        stats = self.stats
        stats.batches += 1
        stats.queries += num_queries
        stats.encode_s += timings.get("encode_s", 0.0)
        stats.search_s += timings.get("search_s", 0.0)
        stats.rerank_s += timings.get("rerank_s", 0.0)
        stats.compute_s += elapsed
        stats.max_batch_queries_seen = max(stats.max_batch_queries_seen, num_queries)
