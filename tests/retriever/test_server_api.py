"""The HTTP contract of the real server: result shape, scores, health, and a 4xx for every bad input."""

import asyncio
import json
import socket
import time

import httpx
import pytest


def _post(server, payload, **kwargs):
    return httpx.post(server.retrieve_url, json=payload, timeout=60, **kwargs)


def test_result_shape_and_scores(dense_server):
    response = _post(dense_server, {"queries": ["who wrote hamlet", "moon landing"], "topk": 4,
                                    "return_scores": True})
    assert response.status_code == 200
    result = response.json()["result"]
    assert len(result) == 2 and all(len(hits) == 4 for hits in result)
    for hits in result:
        assert set(hits[0]) == {"document", "score"}
        assert set(hits[0]["document"]) == {"id", "contents"}
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True) and -1.0 <= scores[-1] <= scores[0] <= 1.0 + 1e-5


@pytest.mark.parametrize("server_name", ["dense_server", "bm25_server"])
def test_no_score_key_without_return_scores(server_name, request):
    server = request.getfixturevalue(server_name)
    for payload in ({"queries": ["apollo 17"], "return_scores": False}, {"queries": ["apollo 17"]}):
        response = _post(server, payload)
        assert response.status_code == 200, response.text
        hits = response.json()["result"][0]
        assert len(hits) == 3  # server default --topk 3 for a missing/null topk
        assert all(set(h) == {"document"} for h in hits)


def test_health(dense_server, bm25_server):
    dense = httpx.get(dense_server.url + "/health").json()
    assert dense["ready"] and dense["index_size"] == 406 and dense["kind"] == "dense"
    assert dense["encoder"].rstrip("/").endswith("model")  # the MiniLM folder
    assert dense["encoder_device"] == "cpu" and dense["search_devices"] == ["cpu"]
    bm25 = httpx.get(bm25_server.url + "/health").json()
    assert bm25["ready"] and bm25["index_size"] == 406 and bm25["kind"] == "bm25"


def test_over_long_query_is_truncated_not_rejected(dense_server):
    response = _post(dense_server, {"queries": ["moon landing " * 3000], "topk": 2})
    assert response.status_code == 200 and len(response.json()["result"][0]) == 2


def test_empty_string_query_is_answered(bm25_server):
    response = _post(bm25_server, {"queries": ["", "the"], "topk": 2})  # no indexed term: no passage
    assert response.status_code == 200 and [len(h) for h in response.json()["result"]] == [0, 0]


BAD_INPUTS = [
    ({"queries": []}, 422, "queries"),
    ({"queries": ["ok", 3]}, 422, "queries.1"),
    ({"queries": "not a list"}, 422, "queries"),
    ({"topk": 3}, 422, "queries"),
    ({"queries": ["q"], "topk": 0}, 422, "topk"),
    ({"queries": ["q"], "topk": -2}, 422, "topk"),
    ({"queries": ["q"], "topk": 51}, 422, "topk"),
    ({"queries": ["q"], "topk": "3"}, 422, "topk"),
    ({"queries": ["q"], "return_scores": "yes"}, 422, "return_scores"),
    ({"queries": ["q"] * 65}, 422, "queries"),
    ({"queries": ["q"], "top_k": 3}, 422, "top_k"),
    (["q"], 422, "body"),
]


@pytest.mark.parametrize("payload,status,field", BAD_INPUTS)
def test_bad_input_gets_4xx_naming_the_field(dense_server, payload, status, field):
    response = _post(dense_server, payload)
    assert response.status_code == status, response.text
    assert field in response.json()["detail"]


def test_invalid_json_and_oversized_body(dense_server):
    response = httpx.post(dense_server.retrieve_url, content=b"{not json", timeout=30,
                          headers={"content-type": "application/json"})
    assert response.status_code == 422 and "body" in response.json()["detail"]
    big = json.dumps({"queries": ["x" * 70000]}).encode()  # server limit is 65536 bytes
    response = httpx.post(dense_server.retrieve_url, content=big, timeout=30)
    assert response.status_code == 413 and "request body" in response.json()["detail"]
    assert httpx.get(dense_server.url + "/health").json()["ready"]


def test_concurrent_requests_are_micro_batched(dense_server):
    before = httpx.get(dense_server.url + "/stats").json()

    async def burst():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(dense_server.retrieve_url, json={"queries": [f"question {i}"]})
                                          for i in range(32)))

    responses = asyncio.run(burst())
    assert all(r.status_code == 200 for r in responses)
    after = httpx.get(dense_server.url + "/stats").json()
    batches = after["batches"] - before["batches"]
    assert after["requests"] - before["requests"] == 32
    assert batches < 32, f"32 concurrent requests ran as {batches} batches: no micro-batching"
    # every request got its own query's results back, not a neighbour's
    single = _post(dense_server, {"queries": ["question 7"]}).json()["result"][0]
    assert responses[7].json()["result"][0] == single


def test_client_killed_mid_request_does_not_affect_others(dense_server):
    """Raw sockets that send a request (or half of one) and vanish, among normal requests."""
    host, port = dense_server.url.removeprefix("http://").split(":")
    body = json.dumps({"queries": ["killed query"] * 64, "topk": 50}).encode()
    head = (f"POST /retrieve HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()

    async def scenario():
        async with httpx.AsyncClient(timeout=60) as client:
            normal = [asyncio.ensure_future(client.post(dense_server.retrieve_url, json={"queries": [f"moon {i}"]}))
                      for i in range(8)]
            for cut in (len(head) + len(body), len(head) + 10):  # whole request, then half a body
                sock = socket.create_connection((host, int(port)))
                sock.sendall((head + body)[:cut])
                await asyncio.sleep(0.05)
                sock.close()
            return await asyncio.gather(*normal)

    responses = asyncio.run(scenario())
    assert all(r.status_code == 200 and len(r.json()["result"][0]) == 3 for r in responses)
    time.sleep(0.5)
    assert _post(dense_server, {"queries": ["still alive"]}).status_code == 200
    assert dense_server.process.poll() is None
