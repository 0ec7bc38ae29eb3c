"""Web backends (serper, google, serpapi, bing, brave) against a local server speaking each API.

The local server on 127.0.0.1 answers as the provider's API reference documents: the request's
method, path, key location and query parameter are checked, and the answer is the documented JSON
(``organic``, ``items``, ``organic_results``, ``webPages.value``, ``web.results``). Each backend is
also started through its documented launch script and served over ``/retrieve``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from search_r1.search.launcher import launch_server
from search_r1.search.web_backends import BACKENDS, Credentials
from search_r1.search.web_client import RateLimiter, WebClientConfig, WebSearchClient, retry_after_seconds
from search_r1.search.web_retriever import WebRetriever

REPO = Path(__file__).resolve().parents[2]
KEY = "test-key"
CSE = "test-cx"
NAMES = ["serper", "google", "serpapi", "bing", "brave"]
PATHS = {"serper": "/search", "google": "/customsearch/v1", "serpapi": "/search", "bing": "/v7.0/search",
         "brave": "/res/v1/web/search"}
ENV = {"serper": {"SERPER_API_KEY": KEY}, "google": {"GOOGLE_API_KEY": KEY, "GOOGLE_CSE_ID": CSE},
       "serpapi": {"SERPAPI_API_KEY": KEY}, "bing": {"BING_API_KEY": KEY}, "brave": {"BRAVE_API_KEY": KEY}}


def documented_answer(name: str, query: str, num: int, base: str) -> dict:
    """What each API returns for ``query`` (per its reference), ``num`` results."""
    rows = [(f"{query} result {i}", f"{base}/page/{i}", f"Snippet {i} about {query} ...") for i in range(1, num + 1)]
    if name == "serper":
        return {"searchParameters": {"q": query}, "organic": [
            {"title": t, "link": u, "snippet": s, "position": i} for i, (t, u, s) in enumerate(rows, 1)]}
    if name == "google":
        return {"kind": "customsearch#search", "queries": {"request": [{"searchTerms": query}]},
                "items": [{"kind": "customsearch#result", "title": t, "link": u, "snippet": s,
                           "displayLink": "127.0.0.1"} for t, u, s in rows]}
    if name == "serpapi":
        return {"search_metadata": {"status": "Success"}, "search_parameters": {"q": query},
                "organic_results": [{"position": i, "title": t, "link": u, "snippet": s}
                                    for i, (t, u, s) in enumerate(rows, 1)]}
    if name == "bing":
        return {"_type": "SearchResponse", "queryContext": {"originalQuery": query},
                "webPages": {"totalEstimatedMatches": 1000, "value": [
                    {"id": f"https://api.bing.microsoft.com/api/v7/#WebPages.{i}", "name": t, "url": u,
                     "snippet": s} for i, (t, u, s) in enumerate(rows)]}}
    return {"type": "search", "query": {"original": query}, "web": {"type": "search", "results": [
        {"title": t, "url": u, "description": s.replace(f"about {query}", f"about <strong>{query}</strong>"),
         "type": "search_result"} for t, u, s in rows]}}


def _authorised(name: str, handler, params: dict) -> bool:
    if name == "serper":
        return handler.headers.get("X-API-KEY") == KEY
    if name == "google":
        return params.get("key") == [KEY] and params.get("cx") == [CSE]
    if name == "serpapi":
        return params.get("api_key") == [KEY] and params.get("engine") == ["google"]
    if name == "bing":
        return handler.headers.get("Ocp-Apim-Subscription-Key") == KEY
    return handler.headers.get("X-Subscription-Token") == KEY


def provider(name: str, fail_first: int = 0, failure=(429, b'{"error": "rate limited"}'), always: bytes | None = None):
    """A handler script answering as API ``name``; the first ``fail_first`` calls get ``failure``;
    ``always`` replaces every answer body (status 200)."""
    state = {"calls": 0}

    def script(handler, body):
        url = urlsplit(handler.path)
        params = parse_qs(url.query)
        if url.path.startswith("/page/"):
            handler.send_json(200, b"<html><body><p>Page text.</p></body></html>", content_type="text/html")
            return
        state["calls"] += 1
        handler.server.requests.append({"method": handler.command, "path": url.path, "params": params,
                                        "headers": dict(handler.headers), "body": body})
        if state["calls"] <= fail_first:
            status, payload = failure
            handler.send_response(status)
            handler.send_header("Retry-After", "0")
            handler.send_header("content-length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
            return
        if always is not None:
            handler.send_json(200, always)
            return
        expected_method = "POST" if name == "serper" else "GET"
        if handler.command != expected_method or url.path != PATHS[name]:
            handler.send_json(404, {"error": f"no route {handler.command} {url.path}"})
            return
        if not _authorised(name, handler, params):
            handler.send_json(403, {"error": "bad key"})
            return
        if name == "serper":
            request = json.loads(body)
            query, num = request["q"], request["num"]
        else:
            query = params["q"][0]
            num = int((params.get("num") or params.get("count") or ["10"])[0])
        base = f"http://127.0.0.1:{handler.server.server_address[1]}"
        handler.send_json(200, documented_answer(name, query, num, base))

    return script


@pytest.fixture
def fake_api(scripted_server):
    def start(name: str, **kwargs):
        server = scripted_server(provider(name, **kwargs))
        server.requests = []
        server.search_url = server.url + PATHS[name]
        return server

    return start


def make_retriever(name: str, url: str, **config) -> WebRetriever:
    client = WebSearchClient(WebClientConfig(**{"backoff": 0.01, **config}))
    return WebRetriever(BACKENDS[name], Credentials(KEY, CSE if name == "google" else None), url, client)


@pytest.mark.parametrize("name", NAMES)
def test_documented_request_and_wiki18_rows(name, fake_api):
    api = fake_api(name)
    retriever = make_retriever(name, api.search_url)
    results = retriever.search(["apollo 17", "who wrote hamlet"], topk=3)
    assert [len(hits) for hits in results] == [3, 3]
    first = results[1][0]
    assert first["document"]["contents"] == '"who wrote hamlet result 1"\nSnippet 1 about who wrote hamlet ...'
    assert first["document"]["id"] == api.url + "/page/1"
    assert [hit["score"] for hit in results[0]] == [1.0, 0.5, pytest.approx(1 / 3)]
    request = api.requests[0]
    if name == "serper":
        assert json.loads(request["body"])["num"] == 3
    elif name == "serpapi":
        assert "num" not in request["params"]  # engine-neutral: the answer is cut to topk
    else:
        assert request["params"][{"google": "num", "bing": "count", "brave": "count"}[name]] == ["3"]
    assert retriever.stats()["failed_queries"] == 0 and retriever.stats()["queries"] == 2


@pytest.mark.parametrize("name", NAMES)
def test_429_then_200_is_retried(name, fake_api):
    api = fake_api(name, fail_first=1)
    retriever = make_retriever(name, api.search_url)
    hits = retriever.search(["moon"], topk=2)[0]
    assert len(hits) == 2 and hits[0]["document"]["contents"].startswith('"moon result 1"')
    client = retriever.stats()["client"]
    assert client["rate_limited"] == 1 and client["retries"] == 1 and client["attempts"] == 2
    assert retriever.stats()["failed_queries"] == 0


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("body,reason", [(b"<html>Service Unavailable</html>", "malformed_json"),
                                         (b'{"items": "x", "organic": 3, "organic_results": "x", '
                                          b'"webPages": [], "web": {"results": {}}}', "malformed_answer")])
def test_malformed_answer_gives_an_empty_result(name, body, reason, fake_api):
    api = fake_api(name, always=body)
    retriever = make_retriever(name, api.search_url)
    assert retriever.search(["moon", "mars"], topk=3) == [[], []]
    stats = retriever.stats()
    assert stats["failed_queries"] == 2 and stats["failed_by_reason"] == {reason: 2}
    assert stats["client"]["retries"] == 0  # a well-delivered answer is not asked again


def test_persistent_5xx_and_4xx(fake_api):
    api = fake_api("brave", fail_first=100, failure=(503, b"busy"))
    retriever = make_retriever("brave", api.search_url, max_retries=2)
    assert retriever.search(["moon"], topk=3) == [[]]
    assert retriever.stats()["failed_by_reason"] == {"http_503": 1} and len(api.requests) == 3
    api = fake_api("bing", fail_first=100, failure=(401, b'{"errors": [{"code": "InvalidAuthorization"}]}'))
    retriever = make_retriever("bing", api.search_url, max_retries=2)
    assert retriever.search(["moon"], topk=3) == [[]]
    assert retriever.stats()["failed_by_reason"] == {"http_401": 1} and len(api.requests) == 1


def test_no_results_is_not_a_failure(fake_api):
    api = fake_api("google", always=b'{"kind": "customsearch#search", "searchInformation": {"totalResults": "0"}}')
    retriever = make_retriever("google", api.search_url)
    assert retriever.search(["zxqv"], topk=3) == [[]]
    assert retriever.stats()["failed_queries"] == 0


def test_concurrency_cap(scripted_server):
    state = {"now": 0, "max": 0}
    lock = threading.Lock()

    def slow(handler, body):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        handler.send_json(200, {"web": {"results": []}})

    api = scripted_server(slow)
    retriever = make_retriever("brave", api.url + "/res/v1/web/search", max_concurrency=2)
    assert retriever.search([f"q{i}" for i in range(8)], topk=3) == [[]] * 8
    assert state["max"] <= 2


def test_rate_limiter_spaces_calls():
    import asyncio

    async def starts() -> list[float]:
        limiter, out = RateLimiter(50.0), []
        for _ in range(5):
            await limiter.wait()
            out.append(time.monotonic())
        return out

    times = asyncio.run(starts())
    assert all(t - times[0] >= k * 0.02 - 1e-3 for k, t in enumerate(times))  # never ahead of 50/s


def test_retry_after_forms():
    from email.utils import formatdate

    assert retry_after_seconds("7") == 7.0
    assert 55 <= retry_after_seconds(formatdate(time.time() + 60, usegmt=True)) <= 60
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None


def test_missing_key_names_flag_and_variable(monkeypatch):
    monkeypatch.delenv("BRAVE_API_KEY", raising=False)
    with pytest.raises(ValueError, match=r"--api_key or \$BRAVE_API_KEY"):
        BACKENDS["brave"].credentials(None)
    monkeypatch.delenv("GOOGLE_CSE_ID", raising=False)
    with pytest.raises(ValueError, match=r"--cse_id or \$GOOGLE_CSE_ID"):
        BACKENDS["google"].credentials("k")


def _script_env(name: str, api) -> dict:
    bin_dir = os.path.dirname(sys.executable)
    return {**ENV[name], "SEARCH_URL": api.search_url, "PATH": bin_dir + os.pathsep + os.environ["PATH"],
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.mark.parametrize("name", NAMES)
def test_launch_script_serves_retrieve(name, fake_api):
    """``bash example/retriever/serve_<name>.sh`` (its documented command) serves ``/retrieve``;
    when the API then fails, queries get empty results and ``/stats`` counts them."""
    api = fake_api(name)
    command = ["bash", str(REPO / "example" / "retriever" / f"serve_{name}.sh")]
    with launch_server(["--web_backoff", "0.01", "--web_max_retries", "1"], command=command,
                       env=_script_env(name, api), startup_timeout=60) as server:
        health = httpx.get(server.url + "/health").json()
        assert health["kind"] == name and health["url"] == api.search_url
        response = httpx.post(server.retrieve_url, json={"queries": ["moon", "mars"], "return_scores": True},
                              timeout=30)
        assert response.status_code == 200
        result = response.json()["result"]
        assert [len(hits) for hits in result] == [3, 3]
        assert result[1][0]["document"]["contents"] == '"mars result 1"\nSnippet 1 about mars ...'
        api.script = provider(name, fail_first=100, failure=(500, b"down"))
        response = httpx.post(server.retrieve_url, json={"queries": ["venus"]}, timeout=30)
        assert response.status_code == 200 and response.json()["result"] == [[]]
        stats = httpx.get(server.url + "/stats").json()["backend"]
        assert stats["queries"] == 3 and stats["failed_queries"] == 1
        assert stats["failed_by_reason"] == {"http_500": 1} and stats["client"]["retries"] == 1


def test_empty_result_renders_an_empty_information_block():
    from search_r1.envs.search_r1.prompts import format_observation
    from search_r1.search.passages import format_passages

    assert format_observation(format_passages([])) == "\n\n<information></information>\n\n"
