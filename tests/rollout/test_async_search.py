"""Searches of the async rollout: batched requests, the in-flight cap, the benchmark's latency proxy.

Real BM25 retrieval server on 127.0.0.1, behind the benchmark's latency proxy (a real HTTP hop
that holds each request for a fixed time, so concurrent searches overlap for sure).
"""

from __future__ import annotations

import statistics

import pytest

from benchmarks.latency_proxy import LatencyModel, launch_proxy
from search_r1.search.client import RetrieverClient
from search_r1.search.passages import format_passages
from tests.rollout.scripted import ScriptedEngine, search_loop
from tests.rollout.test_generation_loop import PARAMS, make_batch, response_text


@pytest.fixture(scope="module")
def slow_retriever_url(retriever_server):
    proxy = launch_proxy(retriever_server.url, fixed_ms=300)
    yield proxy
    proxy.stop()


def _searching_rows(tokenizer, queries: list[str]):
    prompts, batch = make_batch(tokenizer, [f"q{i}" for i in range(len(queries))])
    scripts = [[f"<search>{query}</search>", "<answer>x</answer>"] for query in queries]
    return ScriptedEngine(tokenizer, prompts, scripts), batch


ASYNC = dict(max_turns=2, max_response_length=400, max_obs_length=200, mode="async")


def test_async_searches_of_one_engine_step_go_in_one_request(tokenizer, slow_retriever_url):
    """8 rows search after the same engine step: one request carries their queries, a query
    several rows ask is sent once, and every row gets its own query's passages."""
    proxy = slow_retriever_url
    proxy.stats(reset=True)
    topics = ["England writer", "Berkshire", "moon landing", "Amazon river", "Beethoven"]
    queries = [topics[i % 5] for i in range(8)]
    engine, batch = _searching_rows(tokenizer, queries)
    client = RetrieverClient(proxy.retrieve_url, topk=2, max_concurrency=256)
    out = search_loop(tokenizer, engine, client, **ASYNC).run(batch, PARAMS)
    after = proxy.stats()
    assert out.batch["valid_search"].tolist() == [1] * 8 and out.batch["finished"].tolist() == [1] * 8
    assert after["requests"] == 1 and after["queries"] == 5
    expected = [format_passages(passages).strip()[:80] for passages in client.retrieve(queries)]
    assert len(set(expected)) == 5  # distinct passages per topic, so a row given another's would show
    for i, text in enumerate(expected):
        assert text in response_text(tokenizer, out, i, masked=False)


def test_async_search_cap_bounds_searches_in_flight(tokenizer, slow_retriever_url):
    """8 rows search at once; with ``max_concurrency=3`` at most 3 searches are in flight: they go
    3, 3 and 2 a request, one after the other (each held 300 ms by the proxy)."""
    proxy = slow_retriever_url
    proxy.stats(reset=True)
    engine, batch = _searching_rows(tokenizer, [f"England writer {i}" for i in range(8)])
    client = RetrieverClient(proxy.retrieve_url, topk=2, max_concurrency=3)
    out = search_loop(tokenizer, engine, client, **ASYNC).run(batch, PARAMS)
    after = proxy.stats()
    assert out.batch["valid_search"].tolist() == [1] * 8 and out.batch["finished"].tolist() == [1] * 8
    assert after["requests"] == 3 and after["queries"] == 8 and after["peak_in_flight"] == 1
    assert out.meta_info["timing"]["peak_tool_calls_in_flight"] == 3.0


def test_sync_loop_keeps_the_same_cap_in_queries(tokenizer, slow_retriever_url):
    """The sync loop batches a turn's queries; ``max_concurrency`` / ``batch_size`` requests go at once."""
    client = RetrieverClient(slow_retriever_url.retrieve_url, topk=2, batch_size=2, max_concurrency=4)
    assert client.max_requests_in_flight == 2
    assert RetrieverClient("http://x", batch_size=64, max_concurrency=8).max_requests_in_flight == 1
    results = client.retrieve([f"England {i}" for i in range(7)])
    assert len(results) == 7 and all(results)


def test_latency_model_quantiles():
    model = LatencyModel(200, 1500, seed=1)
    draws = [model.request_delay(1) for _ in range(4000)]
    assert min(draws) >= 0.2 and max(draws) <= 1.5
    assert statistics.median(draws) == pytest.approx((0.2 * 1.5) ** 0.5, rel=0.05)  # geometric mean
    assert statistics.mean(model.request_delay(64) for _ in range(200)) > 1.3  # the slowest of 64
    with pytest.raises(ValueError, match="min_ms"):
        LatencyModel(1500, 200)
