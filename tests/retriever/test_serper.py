"""The serper backend against a local fake of the serper.dev API (and fake linked pages)."""

import functools
import json
import threading

import httpx

from search_r1.search.launcher import launch_server
from search_r1.search.serper import SerperRetriever, passage_around

PAGE = ("<html><head><title>x</title><script>var junk = 1;</script></head><body><nav>menu</nav>"
        "<p>Intro words here. Apollo 17 was the final mission of NASA's Apollo program, landing "
        "in December 1972 with Cernan and Schmitt.</p></body></html>")


def _fake_serper(handler, body, release: threading.Event | None = None):
    if handler.command == "GET":
        if handler.path == "/page/slow":
            # held until the test releases it: the page times out whatever the host's speed
            release.wait(120)
        handler.send_json(200, PAGE.encode(), content_type="text/html; charset=utf-8")
        return
    if handler.headers.get("X-API-KEY") != "test-key":
        handler.send_json(403, {"message": "bad key"})
        return
    query = json.loads(body)
    base = f"http://127.0.0.1:{handler.server.server_address[1]}"
    organic = [{"title": f"{query['q']} result {i}", "link": f"{base}/page/{'slow' if i == 2 else i}",
                "snippet": "Apollo 17 was the final mission of NASA's Apollo ...", "position": i}
               for i in range(1, 6)]
    handler.send_json(200, {"organic": organic[:query["num"]]})


def test_snippet_only(scripted_server):
    server = scripted_server(_fake_serper)
    retriever = SerperRetriever("test-key", server.url + "/search")
    results = retriever.search(["moon", "mars"], topk=3)
    assert [len(r) for r in results] == [3, 3]
    first = results[1][0]
    assert first["document"]["contents"] == '"mars result 1"\nApollo 17 was the final mission of NASA\'s Apollo ...'
    assert first["document"]["id"].endswith("/page/1") and first["score"] == 1.0


def test_full_page_with_timeout(scripted_server):
    """Pages 1 and 3 are fetched and cut to a passage; page 2 never answers within ``fetch_timeout``
    (held until the end), so its snippet is kept. The timeout is generous for the fast pages so a
    loaded host cannot push them past it."""
    release = threading.Event()
    server = scripted_server(functools.partial(_fake_serper, release=release))
    retriever = SerperRetriever("test-key", server.url + "/search", mode="full_page", fetch_timeout=5.0,
                                passage_words=9)
    try:
        hits = retriever.search(["moon"], topk=3)[0]
    finally:
        release.set()
    assert hits[0]["document"]["contents"] == '"moon result 1"\nApollo 17 was the final mission of NASA\'s Apollo'
    assert hits[1]["document"]["contents"].endswith("Apollo ...")  # slow page timed out: snippet kept
    assert passage_around("a b c", "x y", 3) is None


def test_served_through_retrieval_server(scripted_server):
    fake = scripted_server(_fake_serper)
    with launch_server(["--retriever_name", "serper", "--serper_url", fake.url + "/search", "--topk", "2"],
                       env={"SERPER_API_KEY": "test-key"}, startup_timeout=60) as server:
        response = httpx.post(server.retrieve_url, json={"queries": ["moon"]}, timeout=30)
        assert response.status_code == 200
        hits = response.json()["result"][0]
        assert len(hits) == 2 and set(hits[0]) == {"document"}
        assert httpx.get(server.url + "/health").json()["kind"] == "serper"
