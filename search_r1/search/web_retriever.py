"""Online search (serper, google, serpapi, bing, brave) behind the retrieval server's contract.

``WebRetriever.search(queries, topk)`` sends one API call per query through the shared
``WebSearchClient`` (all queries of a micro-batch concurrently, under the client's caps) and
returns wiki-18 rows (``web_backends.render_hits``). A query whose call fails for good (retries
spent, a 4xx, malformed JSON) gets an empty list, which the rollout renders as an empty
``<information></information>`` block; ``stats()`` counts those queries, by reason, for ``/stats``.

``full_page`` mode also fetches each linked page and replaces the snippet with the passage around
it (``web_pages``), ``fetch_concurrency`` pages at a time, ``fetch_timeout`` seconds each.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections import Counter
from typing import Sequence

from search_r1.search.web_backends import BACKENDS, Credentials, MalformedAnswer, WebBackend, WebHit, render_hits
from search_r1.search.web_client import WebClientConfig, WebSearchClient, WebSearchError
from search_r1.search.web_pages import MAX_PAGE_BYTES, html_to_text, passage_around

logger = logging.getLogger(__name__)

MODES = ("snippet_only", "full_page")
LOG_EVERY_FAILURES = 100


class WebRetriever:
    """A web search API as a retriever: ``search``, ``describe``, ``stats``, ``len`` (0).

    Args:
        backend: one of ``web_backends.BACKENDS``.
        credentials: its API key (and Google's ``cx``).
        url: the endpoint (default: the provider's).
        client: the shared HTTP client (default: one with ``WebClientConfig()``).
        mode: ``snippet_only`` or ``full_page``.
        serp_engine: SerpApi's ``engine`` parameter.
        fetch_concurrency / fetch_timeout / passage_words: ``full_page`` settings.
    Raises:
        ValueError: unknown mode.
    """

    def __init__(self, backend: WebBackend, credentials: Credentials, url: str | None = None,
                 client: WebSearchClient | None = None, mode: str = "snippet_only", serp_engine: str = "google",
                 fetch_concurrency: int = 8, fetch_timeout: float = 5.0, passage_words: int = 100):
        if mode not in MODES:
            raise ValueError(f"search_mode must be one of {MODES}, got {mode!r}")
        self.backend, self.credentials = backend, credentials
        self.url = url or backend.default_url
        self.client = client or WebSearchClient()
        self.mode, self.options = mode, {"serp_engine": serp_engine}
        self.fetch_concurrency, self.fetch_timeout, self.passage_words = fetch_concurrency, fetch_timeout, passage_words
        self.kind = backend.name
        self.num_queries = 0
        self.failed = Counter()  # reason -> queries served an empty result

    def __len__(self) -> int:
        return 0

    def describe(self) -> dict:
        return {"kind": self.kind, "encoder": None, "index_size": 0, "mode": self.mode, "url": self.url}

    def stats(self) -> dict:
        """Queries asked, queries that got an empty result because the backend failed (by reason),
        and the shared client's counters."""
        return {"queries": self.num_queries, "failed_queries": sum(self.failed.values()),
                "failed_by_reason": dict(self.failed), "client": self.client.stats.as_dict()}

    def search(self, queries: Sequence[str], topk: int, timings: dict | None = None) -> list[list[dict]]:
        """Top-``topk`` web results per query (blocking; runs on the client's event loop)."""
        start = time.perf_counter()
        results = self.client.run(self.asearch(list(queries), topk))
        if timings is not None:
            timings["search_s"] = timings.get("search_s", 0.0) + time.perf_counter() - start
        return results

    async def asearch(self, queries: list[str], topk: int) -> list[list[dict]]:
        return list(await asyncio.gather(*(self._one(q, topk) for q in queries)))

    async def _one(self, query: str, topk: int) -> list[dict]:
        self.num_queries += 1
        request = self.backend.build(self.url, query, min(topk, self.backend.max_results), self.credentials,
                                     self.options)
        try:
            if request.method == "POST":
                data = await self.client.post_json(request.url, request.payload, request.headers)
            else:
                data = await self.client.get_json(request.url, request.params, request.headers)
            hits = self.backend.parse(data, topk)
        except (WebSearchError, MalformedAnswer) as err:
            self._record_failure(query, err)
            return []
        if self.mode == "full_page":
            hits = await self._expand_pages(hits)
        return render_hits(hits)

    def _record_failure(self, query: str, err: Exception) -> None:
        reason = getattr(err, "reason", "malformed_answer")
        self.failed[reason] += 1
        total = sum(self.failed.values())
        if total == 1 or total % LOG_EVERY_FAILURES == 0:
            logger.warning("%s: %d queries served empty so far; latest (%r): %s", self.kind, total, query[:80], err)

    async def _expand_pages(self, hits: list[WebHit]) -> list[WebHit]:
        limit = asyncio.Semaphore(self.fetch_concurrency)

        async def expand(hit: WebHit) -> WebHit:
            async with limit:
                html = await self.client.fetch_page(hit.link, self.fetch_timeout, MAX_PAGE_BYTES)
            passage = passage_around(html_to_text(html), hit.snippet, self.passage_words) if html else None
            return WebHit(hit.title, hit.link, passage) if passage else hit

        return list(await asyncio.gather(*(expand(h) for h in hits)))


def add_web_args(parser: argparse.ArgumentParser) -> None:
    """The server's options for ``--retriever_name serper|google|serpapi|bing|brave``."""
    group = parser.add_argument_group("web search (--retriever_name serper|google|serpapi|bing|brave)")
    group.add_argument("--api_key", default=None, help="default: the backend's variable ($SERPER_API_KEY, "
                       "$GOOGLE_API_KEY, $SERPAPI_API_KEY, $BING_API_KEY, $BRAVE_API_KEY)")
    group.add_argument("--search_url", default=None, help="API endpoint (default: the provider's; a proxy or test server)")
    group.add_argument("--cse_id", default=None, help="google: search engine id (cx); default $GOOGLE_CSE_ID")
    group.add_argument("--serp_engine", default="google", help="serpapi: engine (google, bing, ...)")
    group.add_argument("--serp_api_key", default=None, help="serpapi: key (Search-R1's flag; same as --api_key)")
    group.add_argument("--serper_api_key", default=None, help="serper: key (same as --api_key)")
    group.add_argument("--serper_url", default=None, help="serper: endpoint (same as --search_url)")
    group.add_argument("--search_mode", choices=MODES, default="snippet_only")
    group.add_argument("--snippet_only", action="store_true", help="Search-R1's google flag: --search_mode snippet_only")
    group.add_argument("--fetch_concurrency", type=int, default=8, help="pages fetched at once (full_page)")
    group.add_argument("--fetch_timeout", type=float, default=5.0, help="seconds per page (full_page)")
    group.add_argument("--passage_words", type=int, default=100, help="words kept per page (full_page)")
    group.add_argument("--web_timeout", type=float, default=10.0, help="seconds per API request")
    group.add_argument("--web_max_retries", type=int, default=3, help="retries on timeouts, 429 and 5xx")
    group.add_argument("--web_backoff", type=float, default=0.5, help="first retry delay (s), doubling")
    group.add_argument("--web_max_backoff", type=float, default=30.0, help="longest wait, Retry-After included (s)")
    group.add_argument("--web_concurrency", type=int, default=8, help="API calls in flight at once")
    group.add_argument("--web_rps", type=float, default=0.0, help="API calls per second at most (0: no cap)")


def web_retriever_from_args(args: argparse.Namespace) -> WebRetriever:
    """The ``WebRetriever`` that the server's CLI arguments describe.

    Raises:
        ValueError: missing key / search engine id, or a bad client limit.
    """
    backend = BACKENDS[args.retriever_name]
    credentials = backend.credentials(args.api_key or args.serp_api_key or args.serper_api_key, args.cse_id)
    client = WebSearchClient(WebClientConfig(
        timeout=args.web_timeout, max_retries=args.web_max_retries, backoff=args.web_backoff,
        max_backoff=args.web_max_backoff, max_concurrency=args.web_concurrency, requests_per_second=args.web_rps))
    return WebRetriever(backend, credentials, args.search_url or args.serper_url,
                        client, mode="snippet_only" if args.snippet_only else args.search_mode,
                        serp_engine=args.serp_engine, fetch_concurrency=args.fetch_concurrency,
                        fetch_timeout=args.fetch_timeout, passage_words=args.passage_words)
