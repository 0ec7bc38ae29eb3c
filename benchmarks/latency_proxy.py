"""A proxy that gives a local retrieval server the latency of an online search API (benchmark-only).

    python benchmarks/latency_proxy.py --upstream http://127.0.0.1:8000 --port 8100 [--min_ms 200 --max_ms 1500]

``POST /retrieve`` is forwarded unchanged to the upstream server after a delay. Each query of a
request draws its own latency from a log-normal distribution whose 2.5% and 97.5% quantiles are
``min_ms`` and ``max_ms`` (clipped to that range), and the request answers after the slowest of
its queries: a server in front of a web search API fans one request's queries out in parallel, so
a batched request costs the longest of its queries, not their sum. ``--fixed_ms`` replaces the
distribution with one constant delay (tests). ``GET /health`` is the upstream's; ``GET /stats``
counts requests, queries and the most requests in flight at once (``?reset=true`` restarts them).

This is a benchmark instrument, not part of the product: the retriever client and server know
nothing about it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fastapi import FastAPI, Request, Response  # noqa: E402  (module level: FastAPI resolves annotations here)

from search_r1.search.launcher import ServerProcess, _wait_ready, free_port  # noqa: E402

Z_975 = 1.959964  # standard normal 97.5% quantile


class LatencyModel:
    """Per-query delays in seconds: log-normal with the given 2.5% / 97.5% quantiles, clipped.

    Raises:
        ValueError: ``min_ms`` not in (0, ``max_ms``).
    """

    def __init__(self, min_ms: float, max_ms: float, seed: int = 0, fixed_ms: float | None = None):
        if fixed_ms is None and not 0 < min_ms < max_ms:
            raise ValueError(f"need 0 < min_ms < max_ms, got {min_ms=} {max_ms=}")
        self.min_s, self.max_s, self.fixed_ms = min_ms / 1000, max_ms / 1000, fixed_ms
        self.mu = (math.log(self.min_s) + math.log(self.max_s)) / 2
        self.sigma = (math.log(self.max_s) - math.log(self.min_s)) / (2 * Z_975)
        self.rng = random.Random(seed)

    def request_delay(self, num_queries: int) -> float:
        """Seconds until a request of ``num_queries`` queries answers (its slowest query)."""
        if self.fixed_ms is not None:
            return self.fixed_ms / 1000
        draws = (self.rng.lognormvariate(self.mu, self.sigma) for _ in range(max(1, num_queries)))
        return min(self.max_s, max(self.min_s, max(draws)))


def create_app(upstream: str, latency: LatencyModel):
    """The FastAPI app: ``/retrieve`` delayed and forwarded, ``/health`` forwarded, ``/stats``."""
    import httpx

    stats = {"requests": 0, "queries": 0, "in_flight": 0, "peak_in_flight": 0, "delay_s": 0.0}
    state: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        async with httpx.AsyncClient(timeout=120.0, limits=httpx.Limits(max_connections=None)) as http:
            state["http"] = http
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        body = await request.body()
        try:
            num_queries = len(json.loads(body).get("queries", []))
        except (ValueError, AttributeError):
            num_queries = 1
        delay = latency.request_delay(num_queries)
        stats["requests"] += 1
        stats["queries"] += num_queries
        stats["delay_s"] += delay
        stats["in_flight"] += 1
        stats["peak_in_flight"] = max(stats["peak_in_flight"], stats["in_flight"])
        try:
            await asyncio.sleep(delay)
            answer = await state["http"].post(upstream + "/retrieve", content=body,
                                              headers={"content-type": "application/json"})
        finally:
            stats["in_flight"] -= 1
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")

    @app.get("/health")
    async def health() -> Response:
        answer = await state["http"].get(upstream + "/health")
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")

    @app.get("/stats")
    async def get_stats(reset: bool = False) -> dict:
        """The counters; ``?reset=true`` starts them again (the peak then counts from now)."""
        out = dict(stats)
        if reset:
            stats.update(requests=0, queries=0, delay_s=0.0, peak_in_flight=stats["in_flight"])
        return out

    return app


class ProxyProcess(ServerProcess):
    """A running proxy: ``url``, ``retrieve_url``, ``stats()``; ``stop()`` also removes its log."""

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)
        shutil.rmtree(os.path.dirname(self.log_path), ignore_errors=True)

    def stats(self, reset: bool = False) -> dict:
        import httpx

        return httpx.get(self.url + "/stats", params={"reset": str(reset).lower()}, timeout=10.0).json()


def launch_proxy(upstream: str, min_ms: float = 200, max_ms: float = 1500, seed: int = 0,
                 fixed_ms: float | None = None, startup_timeout: float = 60.0) -> ProxyProcess:
    """Start the proxy in front of ``upstream`` (base or ``/retrieve`` URL) on a free port.

    Raises:
        RuntimeError: the proxy exited or did not answer ``/health`` in time (with its log tail).
    """
    port = free_port()
    log_dir = tempfile.mkdtemp(prefix="latency_proxy_")
    log_path = os.path.join(log_dir, "proxy.log")
    base = upstream.rstrip("/").removesuffix("/retrieve")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--upstream", base, "--port", str(port),
           "--min_ms", str(min_ms), "--max_ms", str(max_ms), "--seed", str(seed)]
    if fixed_ms is not None:
        cmd += ["--fixed_ms", str(fixed_ms)]
    with open(log_path, "w") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    proxy = ProxyProcess(process, f"http://127.0.0.1:{port}", log_path)
    try:
        _wait_ready(proxy, startup_timeout)
    except BaseException:
        proxy.stop()
        raise
    return proxy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="base URL of the retrieval server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--min_ms", type=float, default=200.0, help="2.5%% quantile (and floor) of a query's latency")
    parser.add_argument("--max_ms", type=float, default=1500.0, help="97.5%% quantile (and cap) of a query's latency")
    parser.add_argument("--fixed_ms", type=float, default=None, help="one constant delay instead")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import uvicorn

    latency = LatencyModel(args.min_ms, args.max_ms, args.seed, args.fixed_ms)
    uvicorn.run(create_app(args.upstream.rstrip("/"), latency), host=args.host, port=args.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
