"""Settings of the trainer's retriever client (``retriever``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetrieverConfig:
    """The retrieval server the search loop calls (``POST /retrieve``)."""

    url: str = "http://127.0.0.1:8000/retrieve"
    """retrieval server endpoint"""
    topk: int = 3
    """passages per query"""
    timeout: float = 30.0
    """seconds per HTTP request"""
    max_retries: int = 3
    """retries with backoff before failing the step"""
    max_concurrency: int = 256
    """queries in flight at once: sync mode sends a turn's queries in requests of 64, at most
    `max_concurrency // 64` at a time; async mode caps the searching trajectories (slime's
    `search_concurrency`)"""
