"""The search tool both environments call: the retriever client behind their actions.

Both Search-R1's tags and the chat template's tool calls search the same retriever with the same
settings (``retriever.*``, ``do_search``), declared once here as the configuration both
environments' run configurations extend; :class:`SearchEnvironment` is the base both derive from
(a call's query goes to the retriever, its passages come back as the observation).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Mapping, Optional

import numpy as np

from search_r1.envs.observation import ObservationEncoder
from search_r1.search.client import RetrieverClient, check_retriever
from search_r1.search.config import RetrieverConfig
from search_r1.search.passages import format_passages
from verl.envs import Action, Environment, Observation
from verl.trainer.ppo.config import PPOConfig


# Per-row counters of a searching environment (Search-R1's names for the trainer's env/* metrics):
# turns with a parsable action, turns that searched, searches answered with no passage (e.g. a
# failing web backend), observations cut to the budget.
SEARCH_COUNTERS = ("valid_action", "valid_search", "empty_search", "obs_truncated")


def search_metrics(stats: Mapping[str, Optional[np.ndarray]], prefix: str) -> dict[str, float]:
    """``<prefix>/number_of_valid_action``, ``ratio_of_valid_action`` (per turn),
    ``number_of_valid_search``, ``number_of_empty_search`` and ``ratio_of_empty_search`` (of all
    searches), from per-row arrays of :data:`SEARCH_COUNTERS` and ``turns``."""
    turns, valid, searches, empty = (stats.get(key) for key in ("turns", "valid_action", "valid_search", "empty_search"))
    metrics = {}
    if valid is not None and turns is not None and len(valid):
        metrics[f"{prefix}/number_of_valid_action"] = float(valid.mean())
        metrics[f"{prefix}/ratio_of_valid_action"] = float((valid / np.maximum(turns, 1)).mean())
    if searches is not None and len(searches):
        metrics[f"{prefix}/number_of_valid_search"] = float(searches.mean())
        if empty is not None:
            metrics[f"{prefix}/number_of_empty_search"] = float(empty.mean())
            metrics[f"{prefix}/ratio_of_empty_search"] = float(empty.sum() / max(int(searches.sum()), 1))
    return metrics


@dataclass(frozen=True)
class SearchRunConfig(PPOConfig):
    """A run whose environment searches: the trainer's tree plus Search-R1's ``retriever`` and ``do_search``."""

    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    """the retrieval server"""
    do_search: bool = True
    """call the retriever on a search; `false` answers every search with no passage (Search-R1's no-search
    baseline)"""


class SearchTool:
    """Queries -> passages lists through the retriever client (``None``: no search, every answer empty).

    Args:
        client: a :class:`~search_r1.search.client.RetrieverClient` (or anything with ``retrieve``
            and, for the async loop, ``session()``/``aretrieve``), or None for ``do_search=false``.
    """

    def __init__(self, client: Optional[RetrieverClient]) -> None:
        self.client = client

    @classmethod
    def from_config(cls, cfg: SearchRunConfig) -> "SearchTool":
        r = cfg.retriever
        client = RetrieverClient(r.url, topk=r.topk, timeout=r.timeout, max_retries=r.max_retries,
                                 max_concurrency=r.max_concurrency) if cfg.do_search else None
        return cls(client)

    @staticmethod
    def check_ready(cfg: SearchRunConfig) -> None:
        """One probe query to ``retriever.url`` (with ``do_search``).

        Raises:
            ValueError: nothing answers there, or not the retriever API.
        """
        if cfg.do_search:
            check_retriever(cfg.retriever.url)

    @staticmethod
    def describe(cfg: SearchRunConfig) -> dict:
        """The search settings an evaluation records, and its title's phrase (``summary``)."""
        summary = (f"top-{cfg.retriever.topk} passages from {cfg.retriever.url}" if cfg.do_search
                   else "no search (do_search=false)")
        return {"do_search": cfg.do_search, "retriever_url": cfg.retriever.url, "topk": cfg.retriever.topk,
                "summary": summary}

    @property
    def max_concurrency(self) -> int:
        """Searches in flight at once in the async loop (``retriever.max_concurrency``; 0: no search)."""
        return int(getattr(self.client, "max_concurrency", 0) or 0)

    def search(self, queries: list[str]) -> list[list[dict]]:
        """Passages per query, in order; a query several rows ask (a GRPO group's samples often
        search the same words) is sent once.

        Raises:
            RetrieverError: the retriever failed for good (after the client's retries).
        """
        if self.client is None:
            return [[] for _ in queries]
        unique = list(dict.fromkeys(queries))
        return _by_query(queries, unique, self.client.retrieve(unique))

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Callable[[list[str]], Awaitable[list[list[dict]]]]]:
        """``async search(queries) -> passages lists``, as :meth:`search` (repeated queries sent
        once), over one connection pool (the async loop's session)."""
        if self.client is None:
            async def nothing(queries: list[str]) -> list[list[dict]]:
                return [[] for _ in queries]
            yield nothing
            return
        async with self.client.session() as retrieve:
            async def search(queries: list[str]) -> list[list[dict]]:
                unique = list(dict.fromkeys(queries))
                return _by_query(queries, unique, await retrieve(unique))
            yield search


def _by_query(queries: list[str], unique: list[str], results: list[list[dict]]) -> list[list[dict]]:
    """The passages lists of ``queries`` from those of their ``unique`` queries, in order."""
    if len(results) != len(unique):
        raise RuntimeError(f"retriever returned {len(results)} result lists for {len(unique)} queries")
    by_query = dict(zip(unique, results))
    return [by_query[query] for query in queries]


class SearchEnvironment(Environment):
    """An environment whose one tool is :class:`SearchTool`: a call's content is the query, and its
    passages (rendered as Search-R1 renders them) come back wrapped by ``self.observations``, cut to
    the observation budget. Subclasses set ``self.tool`` and ``self.observations`` and own the rest
    (tags, parsing, prompts, rewards)."""

    tool: SearchTool
    observations: ObservationEncoder

    def call_tools(self, calls: list[Action]) -> list[Observation]:
        return [self.render(docs) for docs in self.tool.search([call.content for call in calls])]

    @contextlib.asynccontextmanager
    async def tool_session(self) -> AsyncIterator[Callable[[list[Action]], Awaitable[list[Observation]]]]:
        async with self.tool.session() as search:
            async def call(actions: list[Action]) -> list[Observation]:
                return [self.render(docs) for docs in await search([action.content for action in actions])]
            yield call

    def bind(self, tokenizer) -> "SearchEnvironment":
        self.observations.bind(tokenizer)
        return super().bind(tokenizer)

    def render(self, docs: list[dict]) -> Observation:
        """The observation of one search's passages (cut to the budget), with its counters."""
        ids, cut = self.observations.wrap(format_passages(docs).strip())
        return Observation(ids, {"obs_truncated": int(cut), "empty_search": int(not docs)})
