"""Approximate indexes (FAISS IVF, HNSW, cuVS CAGRA) built from a Flat file, and their recall@k.

When a Flat index does not fit (wiki-18's is 64 GB in float32, 32 GB in fp16), an IVF-PQ index is
~1.5 GB and an HNSW graph adds ~0.25 KB per vector to its storage. They are built here from the
vectors of an existing Flat file, read in chunks (``flat_file``), so nothing is re-encoded and host
memory holds the training sample, one chunk and the index being built. Recall@k is measured against
exact search over the same vectors (``exact_topk``, torch, chunked).
"""

from __future__ import annotations

import re
import time

import numpy as np

from .flat_file import METRIC_INNER_PRODUCT, FlatFile

ADD_CHUNK_BYTES = 256 << 20  # rows handed to index.add at a time
MAX_TRAIN_SIZE = 2_000_000
CAGRA = "CAGRA"  # --faiss_type for cuVS CAGRA (FAISS GPU build with cuVS), saved as IndexHNSWCagra


def ivf_nlist(faiss_type: str) -> int | None:
    """The number of IVF lists in an index-factory string (``IVF4096,PQ64`` -> 4096), else None."""
    match = re.search(r"IVF(\d+)", faiss_type)
    return int(match.group(1)) if match else None


def default_train_size(faiss_type: str, ntotal: int) -> int:
    """Training vectors: 256 per IVF list (FAISS's k-means samples no more), else 262,144 (what PQ
    codebooks use at most), capped at ``ntotal`` and ``MAX_TRAIN_SIZE``."""
    nlist = ivf_nlist(faiss_type)
    wanted = 256 * nlist if nlist else 1 << 18
    return int(min(ntotal, wanted, MAX_TRAIN_SIZE))


def sample_rows(flat: FlatFile, size: int, seed: int = 0) -> np.ndarray:
    """``size`` distinct rows drawn uniformly at random (float32 ``(size, dim)``, row order).

    Neighbouring rows of a corpus are often similar (passages of one article), so the sample is
    drawn over the whole file rather than taken from its start.
    """
    rows = np.sort(np.random.default_rng(seed).choice(flat.ntotal, size=size, replace=False))
    return np.ascontiguousarray(flat.memmap()[rows], dtype=np.float32)


def build_from_flat(flat: FlatFile, faiss_type: str, train_size: int | None = None, seed: int = 0,
                    log=print) -> tuple[object, dict]:
    """Build a FAISS index-factory index (``IVF4096,Flat``, ``IVF4096,PQ64``, ``HNSW32``, ...) or
    ``CAGRA`` over all rows of a Flat file, with the file's metric.

    Returns:
        the CPU index and ``{"train_s", "add_s", "train_size"}``.
    Raises:
        ValueError: an index-factory string FAISS rejects, or CAGRA without a cuVS build of FAISS.
    """
    import faiss

    if faiss_type.upper() == CAGRA:
        return build_cagra(flat, log=log)
    metric = faiss.METRIC_INNER_PRODUCT if flat.metric_type == METRIC_INNER_PRODUCT else faiss.METRIC_L2
    try:
        index = faiss.index_factory(flat.dim, faiss_type, metric)
    except RuntimeError as err:
        raise ValueError(f"faiss_type {faiss_type!r}: FAISS cannot build it ({err})") from None
    stats = {"train_s": 0.0, "train_size": 0}
    if not index.is_trained:
        size = train_size or default_train_size(faiss_type, flat.ntotal)
        start = time.perf_counter()
        sample = sample_rows(flat, min(size, flat.ntotal), seed)
        index.train(sample)
        stats.update(train_s=time.perf_counter() - start, train_size=len(sample))
        log(f"trained {faiss_type} on {len(sample)} vectors in {stats['train_s']:.1f} s")
        del sample
    start = time.perf_counter()
    rows = max(1, ADD_CHUNK_BYTES // flat.row_bytes)
    for lo, chunk in flat.iter_chunks(rows):
        index.add(chunk)
        log(f"added {lo + len(chunk)}/{flat.ntotal} vectors")
    stats["add_s"] = time.perf_counter() - start
    return index, stats


def build_cagra(flat: FlatFile, graph_degree: int = 32, intermediate_graph_degree: int = 64,
                gpu: int = 0, log=print) -> tuple[object, dict]:
    """A cuVS CAGRA graph built on the GPU, returned in its CPU form (``IndexHNSWCagra``, which FAISS
    saves and clones back to a ``GpuIndexCagra``). All vectors are held in host memory, in fp16.

    Raises:
        ValueError: the installed FAISS has no CAGRA (needs ``faiss-gpu-cuvs``) or sees no GPU.
    """
    import faiss

    from .faiss_gpu import faiss_has_cagra

    if not faiss_has_cagra():
        raise ValueError("faiss_type CAGRA needs a FAISS GPU build with cuVS (faiss-gpu-cuvs) and a GPU")
    metric = faiss.METRIC_INNER_PRODUCT if flat.metric_type == METRIC_INNER_PRODUCT else faiss.METRIC_L2
    start = time.perf_counter()
    vectors = np.empty((flat.ntotal, flat.dim), dtype=np.float16)
    rows = max(1, ADD_CHUNK_BYTES // flat.row_bytes)
    for lo, chunk in flat.iter_chunks(rows):
        vectors[lo:lo + len(chunk)] = chunk
    read_s = time.perf_counter() - start
    resources = faiss.StandardGpuResources()
    config = faiss.GpuIndexCagraConfig()
    config.device, config.graph_degree = gpu, graph_degree
    config.intermediate_graph_degree = intermediate_graph_degree
    index = faiss.GpuIndexCagra(resources, flat.dim, metric, config)
    start = time.perf_counter()
    index.train(vectors, numeric_type=faiss.Float16)
    train_s = time.perf_counter() - start
    log(f"built CAGRA (degree {graph_degree}) over {flat.ntotal} vectors in {train_s:.1f} s")
    return faiss.index_gpu_to_cpu(index), {"read_s": read_s, "train_s": train_s, "add_s": 0.0,
                                           "train_size": flat.ntotal}


def exact_topk(flat: FlatFile, queries: np.ndarray, k: int, device: str = "cpu",
               stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` over rows ``0:stop`` of a Flat file, streamed in chunks (float32 on ``device``).

    Inner product for an inner-product file, else negated squared L2 (larger is nearer).

    Returns:
        float32 scores and int64 row ids, ``(num_queries, k)``, best first.
    """
    import torch

    stop = flat.ntotal if stop is None else stop
    with torch.inference_mode():
        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(device)
        best_s = torch.full((len(q), 0), -float("inf"), device=device)
        best_i = torch.zeros((len(q), 0), dtype=torch.int64, device=device)
        rows = max(1, ADD_CHUNK_BYTES // flat.row_bytes)
        for lo, chunk in flat.iter_chunks(rows, 0, stop):
            block = torch.from_numpy(chunk).to(device)
            if flat.metric_type == METRIC_INNER_PRODUCT:
                scores = q @ block.T
            else:
                scores = -torch.cdist(q, block).square()
            kk = min(k, block.shape[0])
            s, i = torch.topk(scores, kk, dim=1)
            best_s, order = torch.topk(torch.cat([best_s, s], 1), min(k, best_s.shape[1] + kk), dim=1)
            best_i = torch.gather(torch.cat([best_i, i + lo], 1), 1, order)
    return best_s.cpu().numpy(), best_i.cpu().numpy()


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean over queries of ``|found[:, :k] & truth[:, :k]| / k`` (the usual ANN recall@k).

    Args:
        found, truth: int row ids ``(num_queries, >= k)``; ids < 0 (no hit) never count.
    Raises:
        ValueError: the arrays have different numbers of queries or fewer than ``k`` columns.
    """
    if found.shape[0] != truth.shape[0] or found.shape[1] < k or truth.shape[1] < k:
        raise ValueError(f"recall@{k} needs (n, >= {k}) arrays of equal n, got {found.shape} and {truth.shape}")
    hits = sum(len(set(f[:k][f[:k] >= 0].tolist()) & set(t[:k].tolist())) for f, t in zip(found, truth))
    return hits / (k * found.shape[0])


def measure_recall(index, flat: FlatFile, num_queries: int = 1000, k: int = 10, seed: int = 1,
                   device: str = "cpu", queries: np.ndarray | None = None) -> dict:
    """Recall@k of ``index`` against exact search over the same Flat file.

    Args:
        queries: float32 query vectors; default ``num_queries`` stored rows (then each query's own
            row is among its true neighbours, as it is for the approximate index).
    Returns:
        ``{"recall_at_k", "k", "num_queries", "exact_s", "search_s"}``.
    """
    if queries is None:
        queries = sample_rows(flat, min(num_queries, flat.ntotal), seed)
    start = time.perf_counter()
    _, truth = exact_topk(flat, queries, k, device)
    exact_s = time.perf_counter() - start
    start = time.perf_counter()
    _, found = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    return {"recall_at_k": recall_at_k(found, truth, k), "k": k, "num_queries": len(queries),
            "exact_s": exact_s, "search_s": time.perf_counter() - start}
