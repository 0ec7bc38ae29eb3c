"""RetrieverClient against real local servers that fail on purpose (503s, slowness, 4xx, no server)."""

import asyncio
import json
import threading

import pytest

from search_r1.envs.search_r1.prompts import format_observation
from search_r1.search.passages import format_passages
from search_r1.search.client import RetrieverClient, RetrieverError
from search_r1.search.launcher import free_port


def _ok(handler, body):
    queries = json.loads(body)["queries"]
    handler.send_json(200, {"result": [[{"document": {"id": q, "contents": f'"{q}"\ntext'}}] for q in queries]})


def test_retries_5xx_then_succeeds(scripted_server):
    def script(handler, body):
        if len(handler.server.calls) <= 2:
            handler.send_json(503, {"detail": "warming up"})
        else:
            _ok(handler, body)

    server = scripted_server(script)
    client = RetrieverClient(server.url, max_retries=3, backoff=0.01)
    assert client.retrieve(["a"])[0][0]["document"]["id"] == "a"
    assert len(server.calls) == 3


def test_gives_up_after_retries_naming_url(scripted_server):
    server = scripted_server(lambda handler, body: handler.send_json(500, {"detail": "boom"}))
    client = RetrieverClient(server.url, max_retries=2, backoff=0.01)
    with pytest.raises(RetrieverError, match=f"{server.url}/retrieve.*3 attempts.*HTTP 500.*boom"):
        client.retrieve(["a"])
    assert len(server.calls) == 3


def test_4xx_is_not_retried(scripted_server):
    server = scripted_server(lambda handler, body: handler.send_json(422, {"detail": "topk: bad"}))
    with pytest.raises(RetrieverError, match="HTTP 422.*topk"):
        RetrieverClient(server.url, max_retries=3, backoff=0.01).retrieve(["a"])
    assert len(server.calls) == 1


def test_timeout_is_retried_then_reported(scripted_server):
    """Each attempt ends at the client's timeout, not when the server answers: the server holds every
    answer until the client has given up, so an error naming the timeout after two attempts shows
    both attempts were cut short (a client ignoring its timeout would get the held 200 instead)."""
    release = threading.Event()
    answered = []

    def stalled(handler, body):
        release.wait(120)  # a bound for a broken client only: the test releases it
        answered.append(body)
        _ok(handler, body)

    server = scripted_server(stalled)
    client = RetrieverClient(server.url, timeout=0.2, max_retries=1, backoff=0.01)
    try:
        with pytest.raises(RetrieverError, match="2 attempts.*Timeout"):
            client.retrieve(["a"])
        assert answered == []
        for _ in range(600):  # on a loaded host the server may read the second attempt late
            if len(server.calls) >= 2:
                break
            release.wait(0.05)
        assert len(server.calls) == 2
    finally:
        release.set()


def test_connection_refused_names_url():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RetrieverError, match=f"{url}/retrieve.*ConnectError"):
        RetrieverClient(url, max_retries=1, backoff=0.01).retrieve(["a"])


def test_batches_and_order(scripted_server):
    server = scripted_server(_ok)
    queries = [f"q{i}" for i in range(10)]
    client = RetrieverClient(server.url + "/retrieve", batch_size=4, max_concurrency=2)
    results = client.retrieve(queries)
    assert [hits[0]["document"]["id"] for hits in results] == queries
    sizes = sorted(len(json.loads(body)["queries"]) for body in server.calls)
    assert sizes == [2, 4, 4]
    assert client.retrieve([]) == []


def test_sync_retrieve_inside_running_loop(scripted_server):
    server = scripted_server(_ok)
    client = RetrieverClient(server.url)

    async def caller():
        return client.retrieve(["inside"])  # e.g. a sync rollout step called from async code

    assert asyncio.run(caller())[0][0]["document"]["id"] == "inside"


def test_real_server_render(dense_server):
    client = RetrieverClient(dense_server.url, topk=2)
    results = asyncio.run(client.aretrieve(["when was the last moon landing"]))
    text = format_observation(format_passages(results[0]))
    assert text.startswith("\n\n<information>Doc 1(Title: ") and "Doc 2(Title: " in text
    assert text.endswith("</information>\n\n")


def test_queries_answered_with_no_passage_keep_their_place(scripted_server):
    """A web backend answers a query whose API call failed with no passage: the row gets an empty
    observation, in its own place across the request batches."""
    def script(handler, body):
        queries = json.loads(body)["queries"]
        handler.send_json(200, {"result": [[] if q.startswith("fail") else
                                           [{"document": {"id": q, "contents": '"t"\nx'}}] for q in queries]})

    client = RetrieverClient(scripted_server(script).url, batch_size=2)
    results = client.retrieve(["a", "fail-1", "b", "fail-2", "c"])
    assert [len(r) for r in results] == [1, 0, 1, 0, 1]
    assert format_observation(format_passages(results[1])) == "\n\n<information></information>\n\n"
