"""Fair micro-batching: a large request is split into micro-batches of at most ``max_batch_queries``
and shares them with later callers, who are answered between its chunks.

Real retrievers throughout: BM25 over the repo's example corpus in process (exact, so a split search
can be compared with an unsplit one), and a real dense server (MiniLM over example passages) where
the order of answers is observed through its ``/stats`` counters. Nothing here reads a clock.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from search_r1.search.batching import MicroBatcher, fair_shares
from search_r1.search.launcher import launch_server
from search_r1.search.loading import load_bm25_retriever

REPO = Path(__file__).resolve().parents[2]


def _questions(n: int) -> list[str]:
    rows = [json.loads(line) for path in sorted((REPO / "example/qa").glob("*/*.jsonl")) for line in open(path)]
    return [row["question"] for row in rows][:n]


def test_fair_shares():
    assert fair_shares([500], 256, callers=1) == [256]  # alone: whole micro-batches
    assert fair_shares([500, 1, 1], 256, callers=3) == [85, 1, 1]
    # the previous micro-batch had 17 requests: the big one stays at its share while callers return
    assert fair_shares([485, 1, 1], 256, callers=17) == [15, 1, 1]
    assert fair_shares([1] * 300, 256, callers=300) == [1] * 256 + [0] * 44  # full: arrival order
    assert fair_shares([300, 300], 256, callers=2) == [128, 128]


@pytest.fixture(scope="module")
def bm25(example_bm25):
    index, corpus = example_bm25
    return load_bm25_retriever(str(index), str(corpus))


def test_split_request_matches_unsplit_search(bm25):
    queries = _questions(300) * 2  # 600 queries > 4 x max_batch_queries
    sizes = []

    def search(batch, topk, timings):
        sizes.append(len(batch))
        return bm25.search(batch, topk, timings)

    async def scenario():
        batcher = MicroBatcher(search, max_batch_queries=128)
        await batcher.start()
        try:
            return await batcher.submit(queries, 5), batcher.stats
        finally:
            await batcher.stop()

    results, stats = asyncio.run(scenario())
    assert results == bm25.search(queries, 5)
    assert sizes == [128, 128, 128, 128, 88] and stats.max_batch_queries_seen == 128
    assert stats.requests == 1 and stats.split_requests == 1 and stats.batches == 5


def test_small_request_is_answered_between_the_chunks_of_a_big_one(bm25):
    big_queries, small_queries = _questions(200) * 3, ["small caller: capital of Australia"]
    batches: list[list[str]] = []

    async def scenario():
        loop = asyncio.get_running_loop()
        first_chunk = asyncio.Event()

        def search(batch, topk, timings):
            batches.append(list(batch))
            loop.call_soon_threadsafe(first_chunk.set)
            return bm25.search(batch, topk, timings)

        batcher = MicroBatcher(search, max_batch_queries=32)
        await batcher.start()
        try:
            big = asyncio.ensure_future(batcher.submit(big_queries, 3))
            await first_chunk.wait()  # the big request is being searched
            small = await batcher.submit(small_queries, 3)
            big_done_when_small_answered = big.done()
            return small, big_done_when_small_answered, await big
        finally:
            await batcher.stop()

    small, big_was_done, big = asyncio.run(scenario())
    assert not big_was_done
    assert small == bm25.search(small_queries, 3) and big == bm25.search(big_queries, 3)
    assert max(len(b) for b in batches) <= 32 and sum(map(len, batches)) == len(big_queries) + 1
    with_small = next(i for i, b in enumerate(batches) if small_queries[0] in b)
    assert with_small < len(batches) - 1  # big-request chunks came after the small one's batch


def test_dense_server_interleaves_a_small_caller_with_a_big_request(example_dense):
    """The issue's scenario in small: one request far larger than --max_batch_queries, then a
    single-query request once the big one is being searched (seen on /stats): the small one is
    answered while the big one is still running, and no micro-batch exceeds the cap."""
    index, corpus = example_dense
    cap = 4
    queries = _questions(100) * 4  # 400 queries: 100 micro-batches of 4 when alone
    args = ["--retriever_name", "minilm", "--index_path", str(index), "--corpus_path", str(corpus),
            "--max_batch_queries", str(cap)]
    with launch_server(args, startup_timeout=300) as server:
        stats_url = server.url + "/stats"

        async def scenario():
            async with httpx.AsyncClient(timeout=600) as client:
                big = asyncio.ensure_future(client.post(server.retrieve_url, json={"queries": queries}))
                while (await client.get(stats_url)).json()["queries"] == 0:  # until the first chunk is searched
                    assert not big.done(), "the big request was answered before any micro-batch was recorded"
                    await asyncio.sleep(0.01)
                small = await client.post(server.retrieve_url, json={"queries": ["capital of australia"]})
                return small, big.done(), await big

        small, big_was_done, big = asyncio.run(scenario())
        stats = httpx.get(stats_url).json()
    assert small.status_code == 200 and len(small.json()["result"][0]) == 3
    assert not big_was_done, "the small request waited for the whole big request"
    assert big.status_code == 200
    result = big.json()["result"]
    assert len(result) == 400 and all(len(hits) == 3 for hits in result)
    ids = [[hit["document"]["id"] for hit in hits] for hits in result]
    assert ids[:100] == ids[100:200] == ids[200:300] == ids[300:]  # the same query, in other chunks
    assert stats["max_batch_queries_seen"] <= cap and stats["split_requests"] == 1 and stats["requests"] == 2
