"""Async HTTP client of the retrieval server, used by the rollout's search turns.

Search-R1's rollout posted every turn's queries in one request with no timeout and no retry, so one
slow or restarting retriever stalled or killed a training run. Here the queries of a turn are split
into requests of at most ``batch_size``, sent so that at most ``max_concurrency`` queries are in
flight (``max_concurrency // batch_size`` requests, at least one), each with a timeout; connection
errors, timeouts and 5xx answers are retried with exponential backoff (``backoff * 2**attempt``
seconds), 4xx answers are not (the request itself is wrong). How passages are shown to a model is
the environment's business (``search_r1.envs``), not the client's.

The async rollout sends the searches its trajectories make at about the same time as one call
(split into requests as above): ``session()`` gives its calls one shared connection pool, and the
rollout keeps at most ``max_concurrency`` searches in flight, the same cap as the sync loop's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import AsyncIterator, Awaitable, Callable, Sequence

import httpx

from search_r1.search.config import RetrieverConfig
from verl.utils.aio import run_coroutine


class RetrieverError(RuntimeError):
    """Retrieval failed for good; the message names the URL and the last failure."""


class RetrieverClient:
    """Client of ``POST /retrieve``.

    Args:
        url: the server's ``/retrieve`` URL, or its base URL (``/retrieve`` is appended).
        topk: passages per query.
        timeout: seconds per HTTP request (connect + read).
        max_retries: retries after the first attempt (so ``max_retries + 1`` attempts at most).
        batch_size: most queries per request.
        max_concurrency: queries in flight at once (slime's ``search_concurrency``): a call's
            requests go ``max(1, max_concurrency // batch_size)`` at a time; the async rollout
            keeps this many single-query searches in flight across its trajectories.
        backoff: first retry delay in seconds; doubles each retry.
        return_scores: ask the server for scores.
    """

    def __init__(self, url: str, topk: int = RetrieverConfig.topk, timeout: float = RetrieverConfig.timeout,
                 max_retries: int = RetrieverConfig.max_retries, batch_size: int = 64,
                 max_concurrency: int = RetrieverConfig.max_concurrency, backoff: float = 0.5,
                 return_scores: bool = True):
        if topk < 1 or batch_size < 1 or max_concurrency < 1 or max_retries < 0:
            raise ValueError(f"need topk, batch_size, max_concurrency >= 1 and max_retries >= 0; got "
                             f"{topk=}, {batch_size=}, {max_concurrency=}, {max_retries=}")
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.topk, self.timeout, self.max_retries = topk, timeout, max_retries
        self.batch_size, self.max_concurrency, self.backoff = batch_size, max_concurrency, backoff
        self.return_scores = return_scores

    async def aretrieve(self, queries: Sequence[str], http: httpx.AsyncClient | None = None) -> list[list[dict]]:
        """Top-``topk`` results for each query, in query order.

        Args:
            queries: the search strings.
            http: a connection pool to send through (from :meth:`session`); None opens one for
                this call.
        Returns:
            one list per query of ``{"document": {"id", "contents"}, "score"?}``.
        Raises:
            RetrieverError: a request was rejected (4xx) or still failed after the retries.
        """
        queries = list(queries)
        if not queries:
            return []
        batches = [queries[i:i + self.batch_size] for i in range(0, len(queries), self.batch_size)]
        limit = asyncio.Semaphore(self.max_requests_in_flight)
        async with contextlib.AsyncExitStack() as stack:
            client = http or await stack.enter_async_context(httpx.AsyncClient(timeout=self.timeout))

            async def bounded(batch: list[str]) -> list[list[dict]]:
                async with limit:
                    return await self._post_with_retries(client, batch)

            parts = await asyncio.gather(*(bounded(b) for b in batches))
        return [hits for part in parts for hits in part]

    @property
    def max_requests_in_flight(self) -> int:
        """Requests of one :meth:`aretrieve` call sent at once."""
        return max(1, self.max_concurrency // self.batch_size)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Callable[[Sequence[str]], Awaitable[list[list[dict]]]]]:
        """``async with client.session() as search: await search(queries)``: :meth:`aretrieve`
        over one connection pool shared by every call inside the block (kept-alive connections
        instead of one new connection per search)."""
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits) as http:
            yield functools.partial(self.aretrieve, http=http)

    def retrieve(self, queries: Sequence[str]) -> list[list[dict]]:
        """Blocking ``aretrieve``; safe to call from inside a running event loop (it then runs the
        request loop in a private thread)."""
        return run_coroutine(self.aretrieve(queries), "retriever-client")

    async def _post_with_retries(self, client: httpx.AsyncClient, batch: list[str]) -> list[list[dict]]:
        payload = {"queries": batch, "topk": self.topk, "return_scores": self.return_scores}
        failure = "no attempt made"
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = await client.post(self.url, json=payload)
            except httpx.TransportError as err:  # connection refused/reset, timeouts
                failure = f"{type(err).__name__}: {err or 'no detail'}"
                continue
            if response.status_code >= 500:
                failure = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code >= 400:
                raise RetrieverError(f"retriever {self.url} rejected the request with HTTP "
                                     f"{response.status_code}: {response.text[:300]}")
            return self._parse(response, len(batch))
        raise RetrieverError(f"retriever {self.url} failed after {self.max_retries + 1} attempts; "
                             f"last failure: {failure}")

    def _parse(self, response: httpx.Response, num_queries: int) -> list[list[dict]]:
        try:
            result = response.json()["result"]
        except (ValueError, KeyError, TypeError) as err:
            raise RetrieverError(f"retriever {self.url} sent a malformed answer ({err}): "
                                 f"{response.text[:300]}") from None
        if not isinstance(result, list) or len(result) != num_queries:
            raise RetrieverError(f"retriever {self.url} returned {len(result) if isinstance(result, list) else result!r} "
                                 f"result lists for {num_queries} queries")
        return result


def check_retriever(url: str, timeout_s: float = 10.0) -> None:
    """One probe query to ``POST url``, before a run starts anything slow.

    Raises:
        ValueError: nothing answers, or the answer is not the retriever API's.
    """
    hint = "start one (bash retrieval_launch.sh; docs/retriever.md) or point RETRIEVER_URL / retriever.url at it"
    body = {"queries": ["evaluation probe"], "topk": 1, "return_scores": False}
    try:
        response = httpx.post(url, json=body, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise ValueError(f"no retriever answers at {url} ({type(error).__name__}: {error}); {hint}") from None
    if response.status_code != 200 or "result" not in _json_or_empty(response):
        raise ValueError(f"{url} answered HTTP {response.status_code} without a 'result' list: not the "
                         f"retriever API (POST /retrieve); {hint}")


def _json_or_empty(response) -> dict:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
