"""The one HTTP client every web search backend shares: pooling, timeout, retries, rate caps.

A training run sends thousands of queries to a paid search API that throttles (429), has bad
minutes (5xx) and may answer garbage. One ``WebSearchClient`` per server process owns a pooled
``httpx.AsyncClient`` on a private event loop (so connections are reused across the server's
micro-batches) and applies, to every API call:

* a per-request ``timeout``;
* up to ``max_retries`` retries on connection errors, timeouts, 429 and 5xx, waiting
  ``backoff * 2**attempt`` seconds or the answer's ``Retry-After`` (seconds or an HTTP date),
  whichever is longer, capped at ``max_backoff``; other 4xx answers are not retried;
* a concurrency cap (``max_concurrency`` calls in flight) and a requests-per-second cap
  (``requests_per_second``; call starts, retries included, keep to a ``1 / rps`` grid).

A call that still fails raises ``WebSearchError`` with the reason; the retriever turns that into an
empty result for the query (``web_retriever``), so a failing backend never stops a training run.
The counters in ``stats`` are served on ``GET /stats``.
"""

from __future__ import annotations

import asyncio
import email.utils
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Coroutine

import httpx

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class WebSearchError(RuntimeError):
    """A web API call failed for good (after retries) or answered something unusable.

    Attributes:
        reason: short machine-readable cause (``http_403``, ``timeout``, ``malformed_json`` ...).
    """

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class WebClientConfig:
    """Limits of the shared client (CLI: ``--web_timeout --web_max_retries --web_backoff
    --web_max_backoff --web_concurrency --web_rps``).

    Attributes:
        timeout: seconds per HTTP request (connect + read).
        max_retries: retries after the first attempt.
        backoff: first retry delay in seconds; doubles each retry.
        max_backoff: longest single wait, also for a ``Retry-After`` that asks for more.
        max_concurrency: API calls in flight at once.
        requests_per_second: most API calls started per second; 0 means no cap.
    """

    timeout: float = 10.0
    max_retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 30.0
    max_concurrency: int = 8
    requests_per_second: float = 0.0

    def __post_init__(self):
        if self.timeout <= 0 or self.max_retries < 0 or self.backoff < 0 or self.max_backoff < 0:
            raise ValueError(f"web client: need timeout > 0 and max_retries, backoff, max_backoff >= 0; "
                             f"got {self}")
        if self.max_concurrency < 1 or self.requests_per_second < 0:
            raise ValueError(f"web client: need max_concurrency >= 1 and requests_per_second >= 0; got {self}")


@dataclass
class WebClientStats:
    """Cumulative counters of the shared client."""

    calls: int = 0           # API calls asked for
    attempts: int = 0        # HTTP requests sent (calls + retries)
    retries: int = 0
    rate_limited: int = 0    # 429 answers seen
    failed_calls: int = 0    # calls that raised WebSearchError
    failures: Counter = field(default_factory=Counter)  # reason -> count

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "failures"}
        out["failures"] = dict(self.failures)
        return out


class RateLimiter:
    """Schedules call starts on a ``1 / rate`` second grid: the k-th start after an idle spell is at
    least ``k / rate`` seconds after the first, so no second holds more than ``rate`` (+1) starts
    (no cap when ``rate`` is 0)."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self._next = 0.0
        self._lock: asyncio.Lock | None = None

    async def wait(self) -> None:
        if not self.interval:
            return
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            await asyncio.sleep(start - now)


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds from now: an integer, or an HTTP date (RFC 9110); None if absent
    or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class WebSearchClient:
    """Pooled, rate-limited, retrying JSON client for web search APIs, usable from any thread.

    ``run(coro)`` executes a coroutine on the client's own event loop thread and blocks for its
    result; coroutines given to it call ``get_json`` / ``post_json`` / ``fetch_page``.

    Args:
        config: timeouts, retries and caps.
        user_agent: sent with every request.
    """

    def __init__(self, config: WebClientConfig | None = None, user_agent: str = "search-r1/0.1"):
        self.config = config or WebClientConfig()
        self.stats = WebClientStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="web-search-client", daemon=True)
        self._thread.start()
        self._http: httpx.AsyncClient = self.run(self._open(user_agent))
        self._limit = asyncio.Semaphore(self.config.max_concurrency)
        self._rate = RateLimiter(self.config.requests_per_second)

    async def _open(self, user_agent: str) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=max(16, 2 * self.config.max_concurrency),
                              max_keepalive_connections=max(8, self.config.max_concurrency))
        return httpx.AsyncClient(timeout=self.config.timeout, limits=limits, follow_redirects=True,
                                 headers={"User-Agent": user_agent})

    def run(self, coro: Coroutine) -> Any:
        """Run ``coro`` on the client's loop and return its result (re-raising its exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        if self._loop.is_running():
            self.run(self._http.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    async def get_json(self, url: str, params: dict | None = None, headers: dict | None = None) -> Any:
        """``GET url?params`` and its JSON body, with the retry policy. Raises ``WebSearchError``."""
        return await self._call("GET", url, params=params, headers=headers)

    async def post_json(self, url: str, payload: Any, headers: dict | None = None) -> Any:
        """``POST url`` with a JSON body, and its JSON answer, with the retry policy."""
        return await self._call("POST", url, json=payload, headers=headers)

    async def _call(self, method: str, url: str, **kwargs) -> Any:
        self.stats.calls += 1
        try:
            async with self._limit:
                response = await self._send_with_retries(method, url, **kwargs)
            return _json_body(response, url)
        except WebSearchError as err:
            self.stats.failed_calls += 1
            self.stats.failures[err.reason] += 1
            raise

    async def _send_with_retries(self, method: str, url: str, **kwargs) -> httpx.Response:
        cfg = self.config
        for attempt in range(cfg.max_retries + 1):
            await self._rate.wait()
            self.stats.attempts += 1
            try:
                response = await self._http.request(method, url, **kwargs)
            except httpx.TimeoutException as err:
                reason, detail, wait_hint = "timeout", f"{type(err).__name__} after {cfg.timeout:g} s", None
            except httpx.TransportError as err:
                reason, detail, wait_hint = "connection", f"{type(err).__name__}: {err or 'no detail'}", None
            else:
                if response.status_code < 400:
                    return response
                reason = f"http_{response.status_code}"
                detail = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code == 429:
                    self.stats.rate_limited += 1
                if response.status_code not in RETRY_STATUSES:
                    raise WebSearchError(reason, f"{method} {_no_query(url)} rejected: {detail}")
                wait_hint = retry_after_seconds(response.headers.get("retry-after"))
            if attempt == cfg.max_retries:
                break
            self.stats.retries += 1
            delay = max(cfg.backoff * 2 ** attempt, wait_hint or 0.0)
            await asyncio.sleep(min(delay, cfg.max_backoff))
        raise WebSearchError(reason, f"{method} {_no_query(url)} failed after {cfg.max_retries + 1} "
                                     f"attempts; last: {detail}")

    async def fetch_page(self, url: str, timeout: float, max_bytes: int) -> str | None:
        """Text of an HTML page (first ``max_bytes``), or None when it cannot be had in ``timeout``
        seconds. Pages are not API calls: no retries, no rate cap, not counted in ``stats``."""
        if not url.startswith(("http://", "https://")):
            return None
        try:
            response = await asyncio.wait_for(self._http.get(url), timeout)
        except (httpx.HTTPError, asyncio.TimeoutError):
            return None
        if response.status_code != 200 or "html" not in response.headers.get("content-type", "html"):
            return None
        return response.content[:max_bytes].decode(response.encoding or "utf-8", "replace")


def _json_body(response: httpx.Response, url: str) -> Any:
    try:
        return response.json()
    except ValueError as err:
        raise WebSearchError("malformed_json", f"{_no_query(url)} answered HTTP {response.status_code} "
                                               f"with a body that is not JSON ({err}): "
                                               f"{response.text[:120]!r}") from None


def _no_query(url: str) -> str:
    """The URL without its query string (which may carry an API key) for messages and logs."""
    return url.split("?", 1)[0]
