"""serper.dev (Google results) as a backend: the name earlier releases exported.

``SerperRetriever(api_key, url, mode=...)`` is the ``serper`` ``WebRetriever`` (see
``web_retriever``; request and answer formats in ``web_backends``); ``parse_serper_response``
and ``passage_around`` keep their names too.
"""

from __future__ import annotations

from search_r1.search.web_backends import BACKENDS, Credentials, render_hits
from search_r1.search.web_client import WebClientConfig, WebSearchClient
from search_r1.search.web_pages import html_to_text, passage_around
from search_r1.search.web_retriever import MODES, WebRetriever

__all__ = ["SERPER_URL", "MODES", "SerperRetriever", "parse_serper_response", "html_to_text", "passage_around"]

SERPER_URL = BACKENDS["serper"].default_url


class SerperRetriever(WebRetriever):
    """Google search via serper.dev.

    Args:
        api_key: serper.dev key.
        url: search endpoint (a local server in tests).
        mode: ``snippet_only`` or ``full_page``.
        fetch_concurrency / fetch_timeout / passage_words: ``full_page`` settings.
        request_timeout: seconds per serper call.
        max_concurrency: serper calls in flight at once.
    Raises:
        ValueError: no API key or unknown mode.
    """

    def __init__(self, api_key: str | None, url: str = SERPER_URL, mode: str = "snippet_only",
                 fetch_concurrency: int = 8, fetch_timeout: float = 5.0, request_timeout: float = 10.0,
                 passage_words: int = 100, max_concurrency: int = 8):
        if not api_key:
            raise ValueError("serper backend needs an API key (--api_key or $SERPER_API_KEY)")
        client = WebSearchClient(WebClientConfig(timeout=request_timeout, max_concurrency=max_concurrency))
        super().__init__(BACKENDS["serper"], Credentials(api_key), url, client, mode=mode,
                         fetch_concurrency=fetch_concurrency, fetch_timeout=fetch_timeout,
                         passage_words=passage_words)


def parse_serper_response(data: dict, topk: int) -> list[dict]:
    """serper JSON -> up to ``topk`` ``/retrieve`` rows (the answer box first when there is one)."""
    return render_hits(BACKENDS["serper"].parse(data, topk))
