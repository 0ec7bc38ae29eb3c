"""Searches of the async rollout: the in-flight cap, the latency proxy of the benchmark.

Real BM25 retrieval server on 127.0.0.1, behind the benchmark's latency proxy (a real HTTP hop
that holds each request for a fixed time, so concurrent searches overlap for sure).
"""

from __future__ import annotations

import statistics

import pytest

from benchmarks.latency_proxy import LatencyModel, launch_proxy
from search_r1.search.client import RetrieverClient
from tests.rollout.scripted import ScriptedEngine, search_loop
from tests.rollout.test_generation_loop import PARAMS, make_batch


@pytest.fixture(scope="module")
def slow_retriever_url(retriever_server):
    proxy = launch_proxy(retriever_server.url, fixed_ms=300)
    yield proxy
    proxy.stop()


def test_async_search_cap_bounds_searches_in_flight(tokenizer, slow_retriever_url):
    """8 rows search at once; with ``max_concurrency=3`` the server never sees more than 3."""
    proxy = slow_retriever_url
    proxy.stats(reset=True)
    questions = [f"q{i}" for i in range(8)]
    prompts, batch = make_batch(tokenizer, questions)
    engine = ScriptedEngine(tokenizer, prompts, [["<search>England writer</search>", "<answer>x</answer>"]] * 8)
    client = RetrieverClient(proxy.retrieve_url, topk=2, max_concurrency=3)
    config = dict(max_turns=2, max_response_length=400, max_obs_length=200, mode="async")
    out = search_loop(tokenizer, engine, client, **config).run(batch, PARAMS)
    after = proxy.stats()
    assert out.batch["valid_search"].tolist() == [1] * 8 and out.batch["finished"].tolist() == [1] * 8
    assert after["requests"] == 8 and after["queries"] == 8
    assert after["peak_in_flight"] == 3  # the cap, reached (8 searches waiting, 300 ms each)
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
