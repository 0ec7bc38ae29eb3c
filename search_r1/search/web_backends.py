"""Web search APIs as backends of the retrieval server: how to ask each one and read its answer.

Each backend turns a query into one HTTP call and the API's JSON into ``WebHit`` rows, in rank
order. The formats follow each provider's API reference:

* ``serper`` (serper.dev): ``POST {"q", "num"}``, header ``X-API-KEY``; ``answerBox`` then
  ``organic[].title/link/snippet``.
* ``google`` (Programmable Search JSON API, ``GET /customsearch/v1``): ``key``, ``cx``, ``q``,
  ``num`` (at most 10); ``items[].title/link/snippet`` (no ``items`` when nothing matched).
* ``serpapi`` (``GET /search``): ``engine`` (google, bing, ...), ``q``, ``api_key``;
  ``answer_box`` then ``organic_results[].title/link/snippet``.
* ``bing`` (Bing Web Search v7, ``GET /v7.0/search``): ``q``, ``count`` (at most 50), header
  ``Ocp-Apim-Subscription-Key``; ``webPages.value[].name/url/snippet``.
* ``brave`` (Brave Search API, ``GET /res/v1/web/search``): ``q``, ``count`` (at most 20), header
  ``X-Subscription-Token``; ``web.results[].title/url/description``.

A 200 answer whose structure is not the documented one raises ``MalformedAnswer`` (a ``ValueError``);
the retriever counts it and serves an empty result for that query.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable

TAG = re.compile(r"</?(?:b|strong|em)>")  # Brave marks query words with <strong> in descriptions


@dataclass(frozen=True)
class WebHit:
    title: str
    link: str
    snippet: str


@dataclass(frozen=True)
class WebRequest:
    """One API call: ``method`` (GET or POST), ``url``, query ``params`` or JSON ``payload``, ``headers``."""

    method: str
    url: str
    params: dict | None = None
    payload: dict | None = None
    headers: dict | None = None


class MalformedAnswer(ValueError):
    """The API answered 200 with JSON that is not its documented format."""


@dataclass(frozen=True)
class Credentials:
    """An API key and, for Google, the search engine id (``cx``)."""

    api_key: str
    cse_id: str | None = None


@dataclass(frozen=True)
class WebBackend:
    """One web search API.

    Attributes:
        name: ``--retriever_name`` value.
        default_url: the provider's endpoint (``--search_url`` replaces it).
        key_env: environment variable holding the API key.
        max_results: most results one call can return (``topk`` is capped there).
        build: ``(url, query, topk, credentials, options) -> WebRequest``.
        parse: ``(json, topk) -> list[WebHit]``; raises ``MalformedAnswer``.
    """

    name: str
    default_url: str
    key_env: str
    max_results: int
    build: Callable[[str, str, int, Credentials, dict], WebRequest]
    parse: Callable[[Any, int], list[WebHit]]

    def credentials(self, api_key: str | None, cse_id: str | None = None) -> Credentials:
        """The key given on the command line, else from the environment.

        Raises:
            ValueError: no key (or, for google, no search engine id), naming the flag and variable.
        """
        key = api_key or os.environ.get(self.key_env)
        if not key:
            raise ValueError(f"--retriever_name {self.name} needs an API key: --api_key or ${self.key_env}")
        if self.name == "google":
            cse_id = cse_id or os.environ.get("GOOGLE_CSE_ID")
            if not cse_id:
                raise ValueError("--retriever_name google needs a search engine id: --cse_id or $GOOGLE_CSE_ID")
        return Credentials(key, cse_id)


def _rows(data: Any, path: tuple[str, ...], backend: str) -> list[dict]:
    """``data[path[0]][path[1]]...`` as a list of result objects; a missing key means no results."""
    if not isinstance(data, dict):
        raise MalformedAnswer(f"{backend}: answer is {type(data).__name__}, not a JSON object")
    node: Any = data
    for depth, key in enumerate(path):
        node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            return []
        if depth < len(path) - 1 and not isinstance(node, dict):
            raise MalformedAnswer(f"{backend}: {'.'.join(path[:depth + 1])} is {type(node).__name__}, not an object")
    if not isinstance(node, list) or not all(isinstance(row, dict) for row in node):
        raise MalformedAnswer(f"{backend}: {'.'.join(path)} is not a list of result objects")
    return node


def _hits(rows: list[dict], title: str, link: str, snippet: str, topk: int) -> list[WebHit]:
    out = []
    for row in rows:
        text = row.get(snippet) or ""
        if not isinstance(text, str):
            raise MalformedAnswer(f"{snippet} is {type(text).__name__}, not a string")
        out.append(WebHit(str(row.get(title) or ""), str(row.get(link) or ""), TAG.sub("", text)))
    return out[:topk]


def _answer_box(data: dict, key: str) -> list[WebHit]:
    box = data.get(key)
    if isinstance(box, dict) and (box.get("answer") or box.get("snippet")):
        return [WebHit(str(box.get("title", "")), str(box.get("link", "")), str(box.get("answer") or box["snippet"]))]
    return []


def _serper_parse(data: Any, topk: int) -> list[WebHit]:
    rows = _rows(data, ("organic",), "serper")
    return (_answer_box(data, "answerBox") + _hits(rows, "title", "link", "snippet", topk))[:topk]


def _serpapi_parse(data: Any, topk: int) -> list[WebHit]:
    rows = _rows(data, ("organic_results",), "serpapi")
    if isinstance(data.get("error"), str) and not rows:  # SerpApi reports some failures in a 200 body
        raise MalformedAnswer(f"serpapi: {data['error'][:200]}")
    return (_answer_box(data, "answer_box") + _hits(rows, "title", "link", "snippet", topk))[:topk]


def _serper_request(url: str, query: str, topk: int, cred: Credentials, options: dict) -> WebRequest:
    return WebRequest("POST", url, payload={"q": query, "num": topk}, headers={"X-API-KEY": cred.api_key})


def _google_request(url: str, query: str, topk: int, cred: Credentials, options: dict) -> WebRequest:
    return WebRequest("GET", url, params={"key": cred.api_key, "cx": cred.cse_id, "q": query, "num": topk})


def _google_parse(data: Any, topk: int) -> list[WebHit]:
    return _hits(_rows(data, ("items",), "google"), "title", "link", "snippet", topk)


def _serpapi_request(url: str, query: str, topk: int, cred: Credentials, options: dict) -> WebRequest:
    engine = options.get("serp_engine") or "google"
    return WebRequest("GET", url, params={"engine": engine, "q": query, "api_key": cred.api_key})


def _bing_request(url: str, query: str, topk: int, cred: Credentials, options: dict) -> WebRequest:
    return WebRequest("GET", url, params={"q": query, "count": topk},
                      headers={"Ocp-Apim-Subscription-Key": cred.api_key})


def _bing_parse(data: Any, topk: int) -> list[WebHit]:
    return _hits(_rows(data, ("webPages", "value"), "bing"), "name", "url", "snippet", topk)


def _brave_request(url: str, query: str, topk: int, cred: Credentials, options: dict) -> WebRequest:
    return WebRequest("GET", url, params={"q": query, "count": topk},
                      headers={"X-Subscription-Token": cred.api_key, "Accept": "application/json"})


def _brave_parse(data: Any, topk: int) -> list[WebHit]:
    return _hits(_rows(data, ("web", "results"), "brave"), "title", "url", "description", topk)


BACKENDS: dict[str, WebBackend] = {b.name: b for b in (
    WebBackend("serper", "https://google.serper.dev/search", "SERPER_API_KEY", 100, _serper_request, _serper_parse),
    WebBackend("google", "https://www.googleapis.com/customsearch/v1", "GOOGLE_API_KEY", 10, _google_request,
               _google_parse),
    WebBackend("serpapi", "https://serpapi.com/search", "SERPAPI_API_KEY", 100, _serpapi_request, _serpapi_parse),
    WebBackend("bing", "https://api.bing.microsoft.com/v7.0/search", "BING_API_KEY", 50, _bing_request, _bing_parse),
    WebBackend("brave", "https://api.search.brave.com/res/v1/web/search", "BRAVE_API_KEY", 20, _brave_request,
               _brave_parse),
)}


def render_hits(hits: list[WebHit]) -> list[dict]:
    """``/retrieve`` rows in wiki-18 form: ``{"document": {"id": link, "contents": '"title"\\nsnippet'},
    "score": 1 / rank}``, so the rollout renders ``Doc i(Title: title) snippet``."""
    return [{"document": {"id": hit.link, "contents": f'"{hit.title}"\n{hit.snippet}'}, "score": 1.0 / rank}
            for rank, hit in enumerate(hits, start=1)]
