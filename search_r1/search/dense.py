"""Dense retrieval: a FAISS index over a corpus, queried with an ``Encoder``.

The FAISS index is any index-factory index (``Flat``, ``HNSW32``, ``IVF4096,PQ64`` ...) whose row i is
corpus line i, so indexes written by Search-R1/FlashRAG (``e5_Flat.index``) load unchanged.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from .corpus import Corpus
from .encoders import Encoder


def load_faiss_index(index_path: str, use_gpu: bool = False):
    """Read a FAISS index file; with ``use_gpu``, shard it in fp16 over all visible GPUs.

    Sharding (rather than replicating) lets a 60 GB wiki-18 Flat index fit across GPUs; fp16 halves
    it again, as Search-R1's ``--faiss_gpu`` does.

    Raises:
        RuntimeError: ``use_gpu`` without a GPU build of FAISS or without visible GPUs.
    """
    import faiss

    index = faiss.read_index(index_path)
    if not use_gpu:
        return index
    if not hasattr(faiss, "index_cpu_to_all_gpus") or faiss.get_num_gpus() == 0:
        raise RuntimeError("--faiss_gpu needs faiss-gpu and at least one visible GPU")
    options = faiss.GpuMultipleClonerOptions()
    options.useFloat16 = True
    options.shard = True
    return faiss.index_cpu_to_all_gpus(index, co=options)


class DenseIndex:
    """A FAISS index paired with its corpus.

    Args:
        index: a FAISS index with ``index.ntotal == len(corpus)``.
        corpus: the passages, in index row order.
    """

    def __init__(self, index, corpus: Corpus):
        if index.ntotal != len(corpus):
            raise ValueError(f"index has {index.ntotal} vectors but corpus {corpus.path} has {len(corpus)} rows")
        self.index = index
        self.corpus = corpus
        self._flat_ip = _flat_ip_matrix(index)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search_vectors(self, vectors: np.ndarray, topk: int) -> list[list[dict]]:
        """Top-``topk`` documents for each query vector.

        Args:
            vectors: float32 ``(num_queries, dim)``.
        Returns:
            per query, up to ``topk`` items ``{"document": {"id", "contents"}, "score": float}`` in
            descending score order (fewer when the index is smaller than ``topk``).
        """
        topk = min(topk, len(self))
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if self._flat_ip is not None:
            scores, ids = _flat_ip_search(self._flat_ip, vectors, topk)
        else:
            scores, ids = self.index.search(vectors, topk)
        return hits_from_arrays(self.corpus, ids, scores)


def _flat_ip_matrix(index):
    """The stored vectors of a CPU ``IndexFlatIP`` as a zero-copy torch ``(ntotal, dim)`` view, else None.

    On the shared 2-core CPU, FAISS's own Flat search (its bundled OpenBLAS + a second OpenMP
    runtime next to torch's) measured 5-7 ms per query at 32-64 queries per batch, while one torch
    matmul + topk over the same vectors takes ~1.5-2.5 ms per query; the results are the same exact
    inner-product search. Other index types (HNSW, IVF, GPU) keep FAISS's search.
    """
    import faiss

    if type(index) is not faiss.IndexFlatIP or index.ntotal == 0:
        return None
    import torch

    xb = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)
    return torch.from_numpy(np.asarray(xb).reshape(index.ntotal, index.d))


def _flat_ip_search(matrix, vectors: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``topk`` inner products: float32 scores and int64 row ids, ``(num_queries, topk)``."""
    import torch

    with torch.inference_mode():
        scores, ids = torch.topk(torch.from_numpy(vectors) @ matrix.T, topk, dim=1)
    return scores.numpy(), ids.numpy()


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

    Raises (constructor):
        ValueError: the encoder's dimension differs from the index's (wrong encoder for this index).
    """

    kind = "dense"

    def __init__(self, dense_index: DenseIndex, encoder: Encoder, query_batch_size: int = 64):
        if encoder.dim != dense_index.dim:
            raise ValueError(f"encoder {encoder.spec.model_path} gives {encoder.dim}-d vectors but the "
                             f"index holds {dense_index.dim}-d vectors: wrong encoder for this index")
        self.dense_index = dense_index
        self.encoder = encoder
        self.query_batch_size = query_batch_size

    def __len__(self) -> int:
        return len(self.dense_index)

    def describe(self) -> dict:
        return {"kind": self.kind, "encoder": self.encoder.spec.to_dict(), "index_size": len(self)}

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
