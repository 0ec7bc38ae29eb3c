"""Dense retrieval: a FAISS index over a corpus, queried with an ``Encoder``.

The FAISS index is any index-factory index (``Flat``, ``HNSW32``, ``IVF4096,PQ64`` ...) whose row i is
corpus line i, so indexes written by Search-R1/FlashRAG (``e5_Flat.index``) load unchanged. Flat
inner-product indexes are usually served by ``FlatShards`` (torch) rather than FAISS: see
``loading`` for who searches where.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from .corpus import Corpus
from .encoders import Encoder
from .flat_shards import FlatShards, flat_ip_vectors


class DenseIndex:
    """Vectors paired with their corpus: a FAISS index, or ``FlatShards`` searched with torch.

    Args:
        index: a FAISS index (CPU or GPU) or a ``FlatShards``, with as many rows as ``corpus``.
        corpus: the passages, in index row order.
        torch_devices: for a CPU FAISS ``IndexFlatIP``: search its vectors with torch, sharded in
            fp16 over these devices (``--faiss_gpu`` without a GPU build of FAISS). None: CPU search.
        faiss_gpus: the GPUs a FAISS GPU ``index`` lives on (reported by ``search_devices``).

    Raises:
        ValueError: the index and corpus sizes differ; ``torch_devices`` with an index that is not
            an inner-product Flat index (other types need a GPU build of FAISS for GPU search).
    """

    def __init__(self, index, corpus: Corpus, torch_devices: list[str] | None = None,
                 faiss_gpus: list[int] | None = None):
        import torch

        ntotal = index.ntotal
        if ntotal != len(corpus):
            raise ValueError(f"index has {ntotal} vectors but corpus {corpus.path} has {len(corpus)} rows")
        self.corpus = corpus
        self.faiss_gpus = list(faiss_gpus or [])
        self.load_s: dict = {}  # seconds per start-up part, set by ``loading.load_dense_index``
        if isinstance(index, FlatShards):
            self.index, self._shards = None, index
            return
        self.index = index  # owns the memory a CPU shard views
        vectors = flat_ip_vectors(index)
        if torch_devices and vectors is None:
            raise ValueError(f"GPU search without faiss-gpu supports Flat inner-product indexes only, "
                             f"not {type(index).__name__}: install faiss-gpu or serve on the CPU")
        self._shards = None
        if torch_devices:
            self._shards = FlatShards(vectors, torch_devices, dtype=torch.float16)
        elif vectors is not None:
            self._shards = FlatShards(vectors, ["cpu"])

    @property
    def search_devices(self) -> list[str]:
        """Where the vector search runs: torch devices (``cuda:0``, ``cpu``), ``faiss:cuda:N`` for
        FAISS GPU indexes, ``faiss`` for FAISS on the CPU."""
        if self._shards is not None:
            return self._shards.devices
        return [f"faiss:cuda:{g}" for g in self.faiss_gpus] or ["faiss"]

    @property
    def index_type(self) -> str:
        """``Flat`` (inner-product vectors searched by torch) or the FAISS index's class name."""
        return "Flat" if self._shards is not None else type(self.index).__name__

    @property
    def dim(self) -> int:
        return self._shards.dim if self._shards is not None else int(self.index.d)

    def __len__(self) -> int:
        return self._shards.ntotal if self._shards is not None else int(self.index.ntotal)

    def search_vectors(self, vectors: np.ndarray, topk: int) -> list[list[dict]]:
        """Top-``topk`` documents for each query vector.

        Args:
            vectors: float32 ``(num_queries, dim)``.
        Returns:
            per query, up to ``topk`` items ``{"document": {"id", "contents"}, "score": float}`` in
            descending score order (fewer when the index is smaller than ``topk``).
        """
        scores, ids = self.search_ids(vectors, topk)
        return hits_from_arrays(self.corpus, ids, scores)

    def search_ids(self, vectors: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and row ids ``(num_queries, min(topk, len))`` (ids < 0: fewer hits than asked)."""
        topk = min(topk, len(self))
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if self._shards is not None:
            return self._shards.search(vectors, topk)
        return self.index.search(vectors, topk)


def hits_from_arrays(corpus: Corpus, ids: np.ndarray, scores: np.ndarray) -> list[list[dict]]:
    """Turn ``(num_queries, k)`` row ids and scores into result lists (ids < 0 are dropped)."""
    valid = ids >= 0
    documents = iter(corpus.take(ids[valid].tolist()))
    results = []
    for row_ids, row_scores, row_valid in zip(ids, scores, valid):
        results.append([{"document": next(documents), "score": float(s)}
                        for s, ok in zip(row_scores, row_valid) if ok])
    return results


class DenseRetriever:
    """Encode queries and search a ``DenseIndex``.

    Args:
        query_batch_size: queries per encoder forward. Queries are length-sorted first, so small
            batches pad little: on 2 CPU cores MiniLM took 4.4 ms/query in batches of 16 against 6.3
            in one batch of 64 (NQ questions). GPUs prefer one large batch. None: 16 on CPU, else 256.

    Raises (constructor):
        ValueError: the encoder's dimension differs from the index's (wrong encoder for this index).
    """

    kind = "dense"

    def __init__(self, dense_index: DenseIndex, encoder: Encoder, query_batch_size: int | None = None):
        if encoder.dim != dense_index.dim:
            raise ValueError(f"encoder {encoder.spec.model_path} gives {encoder.dim}-d vectors but the "
                             f"index holds {dense_index.dim}-d vectors: wrong encoder for this index")
        self.dense_index = dense_index
        self.encoder = encoder
        self.query_batch_size = query_batch_size or (16 if encoder.device == "cpu" else 256)
        self.load_s: dict = {}  # seconds per start-up part, set by ``loading.load_dense_retriever``

    def __len__(self) -> int:
        return len(self.dense_index)

    def describe(self) -> dict:
        return {"kind": self.kind, "encoder": self.encoder.spec.to_dict(), "index_size": len(self),
                "index_type": self.dense_index.index_type, "encoder_device": self.encoder.device,
                "search_devices": self.dense_index.search_devices, "load_s": self.load_s}

    def search(self, queries: Sequence[str], topk: int, timings: dict | None = None) -> list[list[dict]]:
        """Top-``topk`` hits per query (see ``DenseIndex.search_vectors``); adds ``encode_s`` and
        ``search_s`` (seconds) to ``timings`` when given."""
        start = time.perf_counter()
        vectors = self.encoder.encode(list(queries), is_query=True, batch_size=self.query_batch_size)
        encoded = time.perf_counter()
        results = self.dense_index.search_vectors(vectors, topk)
        if timings is not None:
            timings["encode_s"] = timings.get("encode_s", 0.0) + encoded - start
            timings["search_s"] = timings.get("search_s", 0.0) + time.perf_counter() - encoded
        return results
