"""Cross-encoder reranking behind any first-stage retriever (Search-R1's retrieve-10, rerank-to-3).

A first stage (dense, BM25 or a web backend) returns ``retrieval_topk`` candidates per query; a
cross-encoder reads each (query, passage) pair jointly and the ``topk`` best by its score are
served, with ``score`` = the cross-encoder's score. Any Hugging Face sequence-classification
checkpoint loads (``AutoModelForSequenceClassification``): one logit (``cross-encoder/ms-marco-*``,
and ours from ``scripts/build_reranker.py``) is the score; with two labels the score is the
log-odds of the last one.

The server's micro-batcher hands the reranker every query of a batch at once, so under load the
pairs of many requests share forwards of ``batch_size`` pairs (sorted by length, so a forward pads
little). Passages are shown to the cross-encoder as the rollout shows them to the policy,
``(Title: T) text`` (Search-R1's reranker does the same).
"""

from __future__ import annotations

import os
import time
from typing import Sequence

import numpy as np

from search_r1.search.passages import split_contents


def pair_text(contents: str) -> str:
    """A wiki-18 ``contents`` string as the reranker reads it: ``(Title: T) text``."""
    title, text = split_contents(contents)
    return f"(Title: {title}) {text}"


OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
DEFAULT_HUB_ENDPOINT = "https://huggingface.co"


def resolve_model_path(model_path: str, flag: str = "--reranker_model") -> str:
    """Where ``model_path`` loads from: a local folder as is, a hub id already in the local Hugging
    Face cache as its cached snapshot folder (no network), any other hub id as is (transformers
    downloads it) once one connection to the hub has succeeded.

    Without that check transformers retries an unreachable hub for about a minute before its
    ``OSError``; here an offline machine gets one line at once.

    Raises:
        FileNotFoundError: not a folder, not cached, and offline (``$HF_HUB_OFFLINE`` /
            ``$TRANSFORMERS_OFFLINE`` set, or the hub endpoint refused the connection); the message
            names ``flag``, the model, and the offline way to a reranker.
    """
    if os.path.isdir(model_path):
        return model_path
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    build = "build one offline with: python scripts/build_reranker.py"
    try:
        cached = try_to_load_from_cache(model_path, "config.json")
    except HFValidationError:
        raise FileNotFoundError(f"{flag} {model_path}: no such folder (nor a hub id); {build}") from None
    if isinstance(cached, str):
        return os.path.dirname(cached)
    offline = _hub_offline_reason()
    if offline:
        raise FileNotFoundError(f"{flag} {model_path}: no such folder, not in the Hugging Face cache, and "
                                f"{offline}; {build}")
    return model_path


def _hub_offline_reason() -> str | None:
    """Why the hub cannot be used now (an offline variable, a refused connection), or None."""
    import httpx

    for name in OFFLINE_VARIABLES:
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"${name} is set"
    endpoint = os.environ.get("HF_ENDPOINT", DEFAULT_HUB_ENDPOINT).rstrip("/")
    try:
        httpx.head(endpoint, timeout=10.0)
    except httpx.HTTPError as err:
        return f"the hub {endpoint} cannot be reached ({type(err).__name__}: {err})"
    return None


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class CrossEncoderReranker:
    """A sequence-classification model scoring (query, passage) pairs.

    Args:
        model_path: local folder or hub id.
        device: ``cuda`` / ``cpu`` (default: a GPU when there is one).
        batch_size: pairs per forward.
        max_length: tokens per pair; the passage is truncated first.
        use_fp16: half precision (default: on GPU).
    Raises:
        ValueError: the model has more than two labels (no single relevance score).
    """

    def __init__(self, model_path: str, device: str | None = None, batch_size: int = 32,
                 max_length: int = 512, use_fp16: bool | None = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.model_path, self.device = model_path, device or default_device()
        self.batch_size, self.max_length = batch_size, max_length
        half = self.device != "cpu" if use_fp16 is None else use_fp16 and self.device != "cpu"
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            model_path, dtype=torch.float16 if half else torch.float32).to(self.device).eval()
        self.num_labels = int(self.model.config.num_labels)
        if self.num_labels > 2:
            raise ValueError(f"reranker {model_path}: {self.num_labels} labels; need 1 (a relevance logit) "
                             "or 2 (not relevant / relevant)")
        self.max_length = min(max_length, int(getattr(self.tokenizer, "model_max_length", max_length) or max_length))

    def describe(self) -> dict:
        return {"model": self.model_path, "device": self.device, "batch_size": self.batch_size,
                "max_length": self.max_length, "dtype": str(self.model.dtype).replace("torch.", "")}

    def score(self, queries: Sequence[str], passages: Sequence[str]) -> np.ndarray:
        """Relevance scores of the pairs ``(queries[i], passages[i])``.

        Returns:
            float32 array of shape ``(len(queries),)``; higher is more relevant.
        """
        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries for {len(passages)} passages")
        order = np.argsort([-(len(q) + len(p)) for q, p in zip(queries, passages)], kind="stable")
        out = np.empty(len(queries), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            out[idx] = self._score_batch([queries[i] for i in idx], [passages[i] for i in idx])
        return out

    def _score_batch(self, queries: list[str], passages: list[str]) -> np.ndarray:
        import torch

        inputs = self.tokenizer(queries, passages, truncation="only_second", max_length=self.max_length,
                                padding=True, return_tensors="pt").to(self.device)
        with torch.inference_mode():
            logits = self.model(**inputs).logits.float()
        scores = logits[:, 0] if self.num_labels == 1 else logits[:, 1] - logits[:, 0]
        return scores.cpu().numpy()


class RerankedRetriever:
    """``first_stage`` followed by ``reranker``; same ``search`` contract as any retriever.

    Args:
        first_stage: any retriever (``search``, ``describe``, ``len``).
        reranker: scores the candidates.
        retrieval_topk: candidates fetched per query (``--retrieval_topk``); a request may ask for
            at most this many results.
    """

    def __init__(self, first_stage, reranker: CrossEncoderReranker, retrieval_topk: int = 10):
        if retrieval_topk < 1:
            raise ValueError(f"--retrieval_topk must be >= 1, got {retrieval_topk}")
        self.first_stage, self.reranker, self.retrieval_topk = first_stage, reranker, retrieval_topk
        self.kind = first_stage.kind

    def __len__(self) -> int:
        return len(self.first_stage)

    def describe(self) -> dict:
        info = dict(self.first_stage.describe())
        info["reranker"] = {**self.reranker.describe(), "retrieval_topk": self.retrieval_topk}
        return info

    def stats(self) -> dict:
        return self.first_stage.stats() if hasattr(self.first_stage, "stats") else {}

    def search(self, queries: Sequence[str], topk: int, timings: dict | None = None) -> list[list[dict]]:
        """The ``topk`` (<= ``retrieval_topk``) best of each query's candidates by reranker score."""
        timings = {} if timings is None else timings
        candidates = self.first_stage.search(queries, self.retrieval_topk, timings)
        start = time.perf_counter()
        pair_queries = [q for q, hits in zip(queries, candidates) for _ in hits]
        pair_passages = [pair_text(hit["document"]["contents"]) for hits in candidates for hit in hits]
        scores = self.reranker.score(pair_queries, pair_passages) if pair_queries else np.zeros(0)
        results, offset = [], 0
        for hits in candidates:
            part = scores[offset:offset + len(hits)]
            offset += len(hits)
            best = np.argsort(-part, kind="stable")[:topk]
            results.append([{"document": hits[i]["document"], "score": float(part[i])} for i in best])
        timings["rerank_s"] = timings.get("rerank_s", 0.0) + time.perf_counter() - start
        return results
