"""Online search through serper.dev (Google results) with the local server's output contract.

Each query becomes one ``POST {url}`` with ``{"q": query, "num": topk}`` and header ``X-API-KEY``;
serper answers ``{"answerBox"?: {...}, "organic": [{"title", "link", "snippet", "position"}]}``.
Results are rendered as wiki-18 rows so the rollout sees the same ``Doc i(Title: ...)`` text:
``{"document": {"id": link, "contents": '"title"\\nsnippet'}, "score": 1 / position}``.

``snippet_only`` uses serper's snippets. ``full_page`` also fetches each linked page (bounded
concurrency, per-page timeout, size cap), extracts its text and keeps ``passage_words`` words starting
where the snippet occurs; a page that fails or lacks the snippet falls back to the snippet.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
from html.parser import HTMLParser
from typing import Sequence

SERPER_URL = "https://google.serper.dev/search"
MODES = ("snippet_only", "full_page")
MAX_PAGE_BYTES = 2 << 20


def add_serper_args(parser: argparse.ArgumentParser) -> None:
    """The server's serper options (used with ``--retriever_name serper``)."""
    group = parser.add_argument_group("serper (online search)")
    group.add_argument("--serper_api_key", default=None, help="default: $SERPER_API_KEY")
    group.add_argument("--serper_url", default=SERPER_URL)
    group.add_argument("--search_mode", choices=MODES, default="snippet_only")
    group.add_argument("--fetch_concurrency", type=int, default=8, help="pages fetched at once (full_page)")
    group.add_argument("--fetch_timeout", type=float, default=5.0, help="seconds per page (full_page)")
    group.add_argument("--passage_words", type=int, default=100, help="words kept per page (full_page)")


class SerperError(RuntimeError):
    """serper.dev answered with an error or could not be reached."""


class SerperRetriever:
    """Google search via serper.dev, returning ``/retrieve`` result lists.

    Args:
        api_key: serper.dev key.
        url: search endpoint (a local fake in tests).
        mode: ``snippet_only`` or ``full_page``.
        fetch_concurrency: pages fetched at once in ``full_page`` mode.
        fetch_timeout: seconds allowed per page.
        request_timeout: seconds allowed per serper call.
        passage_words: words kept from a fetched page.
        max_concurrency: serper calls in flight at once.
    Raises:
        ValueError: no API key or unknown mode.
    """

    kind = "serper"

    def __init__(self, api_key: str | None, url: str = SERPER_URL, mode: str = "snippet_only",
                 fetch_concurrency: int = 8, fetch_timeout: float = 5.0, request_timeout: float = 10.0,
                 passage_words: int = 100, max_concurrency: int = 8):
        if not api_key:
            raise ValueError("serper backend needs an API key (--serper_api_key or $SERPER_API_KEY)")
        if mode not in MODES:
            raise ValueError(f"search_mode must be one of {MODES}, got {mode!r}")
        self.api_key, self.url, self.mode = api_key, url, mode
        self.fetch_concurrency, self.fetch_timeout = fetch_concurrency, fetch_timeout
        self.request_timeout, self.passage_words = request_timeout, passage_words
        self.max_concurrency = max_concurrency

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SerperRetriever":
        return cls(args.serper_api_key or os.environ.get("SERPER_API_KEY"), args.serper_url,
                   args.search_mode, args.fetch_concurrency, args.fetch_timeout,
                   passage_words=args.passage_words)

    def __len__(self) -> int:
        return 0

    def describe(self) -> dict:
        return {"kind": self.kind, "encoder": None, "index_size": 0, "mode": self.mode, "url": self.url}

    def search(self, queries: Sequence[str], topk: int, timings: dict | None = None) -> list[list[dict]]:
        """Blocking search (runs its own event loop; called from the server's worker thread)."""
        start = time.perf_counter()
        results = asyncio.run(self.asearch(list(queries), topk))
        if timings is not None:
            timings["search_s"] = timings.get("search_s", 0.0) + time.perf_counter() - start
        return results

    async def asearch(self, queries: list[str], topk: int) -> list[list[dict]]:
        """Search all queries concurrently (at most ``max_concurrency`` serper calls at once)."""
        import httpx

        limit = asyncio.Semaphore(self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.request_timeout, follow_redirects=True) as client:
            async def one(query: str) -> list[dict]:
                async with limit:
                    hits = await self._query(client, query, topk)
                if self.mode == "full_page":
                    hits = await self._expand_pages(client, hits)
                return hits

            return list(await asyncio.gather(*(one(q) for q in queries)))

    async def _query(self, client, query: str, topk: int) -> list[dict]:
        import httpx

        try:
            response = await client.post(self.url, json={"q": query, "num": topk},
                                         headers={"X-API-KEY": self.api_key})
        except httpx.HTTPError as err:
            raise SerperError(f"serper request to {self.url} failed: {type(err).__name__}: {err}") from err
        if response.status_code != 200:
            raise SerperError(f"serper {self.url} answered {response.status_code}: {response.text[:200]}")
        return parse_serper_response(response.json(), topk)

    async def _expand_pages(self, client, hits: list[dict]) -> list[dict]:
        limit = asyncio.Semaphore(self.fetch_concurrency)

        async def expand(hit: dict) -> dict:
            async with limit:
                text = await fetch_page_text(client, hit["document"]["id"], self.fetch_timeout)
            title, _, snippet = hit["document"]["contents"].partition("\n")
            passage = passage_around(text, snippet, self.passage_words) if text else None
            if passage:
                hit = {**hit, "document": {**hit["document"], "contents": f"{title}\n{passage}"}}
            return hit

        return list(await asyncio.gather(*(expand(h) for h in hits)))


def parse_serper_response(data: dict, topk: int) -> list[dict]:
    """serper JSON -> up to ``topk`` hits (the answer box first when there is one)."""
    items = []
    box = data.get("answerBox")
    if box and (box.get("answer") or box.get("snippet")):
        items.append((box.get("title", ""), box.get("link", ""), box.get("answer") or box.get("snippet")))
    for row in data.get("organic", []):
        items.append((row.get("title", ""), row.get("link", ""), row.get("snippet", "")))
    return [{"document": {"id": link, "contents": f'"{title}"\n{snippet}'}, "score": 1.0 / rank}
            for rank, (title, link, snippet) in enumerate(items[:topk], start=1)]


async def fetch_page_text(client, url: str, timeout: float) -> str | None:
    """Visible text of an HTML page, or None when it cannot be fetched in time."""
    import httpx

    if not url.startswith(("http://", "https://")):
        return None
    try:
        response = await asyncio.wait_for(client.get(url), timeout)
    except (httpx.HTTPError, asyncio.TimeoutError):
        return None
    if response.status_code != 200 or "html" not in response.headers.get("content-type", "html"):
        return None
    return html_to_text(response.content[:MAX_PAGE_BYTES].decode(response.encoding or "utf-8", "replace"))


class _TextExtractor(HTMLParser):
    SKIP = {"script", "style", "noscript", "head", "nav", "footer"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skipping:
            self.skipping -= 1

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """Visible text of an HTML document, whitespace collapsed."""
    parser = _TextExtractor()
    parser.feed(html)
    return re.sub(r"\s+", " ", " ".join(parser.parts)).strip()


def passage_around(text: str, snippet: str, num_words: int) -> str | None:
    """``num_words`` words of ``text`` starting where the snippet's first words occur, else None."""
    words = text.split()
    probe = [w for w in re.sub(r"\.\.\.|…", " ", snippet).split()][:6]
    if not probe or not words:
        return None
    for start in range(len(words) - len(probe) + 1):
        if words[start:start + len(probe)] == probe:
            return " ".join(words[start:start + num_words])
    return None
