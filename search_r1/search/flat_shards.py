"""Exact inner-product search over a Flat index's vectors with torch, sharded over devices.

Three uses:
- CPU: one torch matmul + topk beats FAISS's own Flat search on the shared 2-core machine (its
  bundled OpenBLAS and second OpenMP runtime fight torch's threads; 5-7 ms vs ~2 ms per query).
- ``--faiss_gpu`` without a GPU build of FAISS, or with ``--gpu_search torch``: the vectors are
  split row-wise over all visible GPUs in fp16, like FAISS's sharded ``index_cpu_to_all_gpus``, and
  each shard answers with its own top-k, merged on the host.
- Loading: ``load_flat_shards`` reads a FAISS Flat file in chunks straight into the shards
  (``flat_file``), so host memory holds a few staging chunks, never the whole index.

The search is the same exact search as FAISS's ``IndexFlatIP``; only the arithmetic precision differs.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from .flat_file import FlatFile

STAGING_BYTES = 64 << 20  # one staging chunk of the chunked loader
STAGING_BUFFERS = 4  # chunks read ahead in parallel while earlier ones are copied to the devices
SCORE_BUDGET_BYTES = {"cuda": 1 << 30, "cpu": 256 << 20}  # scores held at once per shard while searching


def flat_ip_vectors(index):
    """The stored vectors of a CPU inner-product ``IndexFlat`` as a zero-copy torch ``(ntotal, dim)``
    view, else None (other index types, or an empty index)."""
    import faiss
    import torch

    if not isinstance(index, faiss.IndexFlat) or index.metric_type != faiss.METRIC_INNER_PRODUCT \
            or index.ntotal == 0:
        return None
    xb = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)
    return torch.from_numpy(np.asarray(xb).reshape(index.ntotal, index.d))


def shard_bounds(num_rows: int, num_shards: int) -> list[int]:
    """Row boundaries of ``num_shards`` near-equal contiguous shards (``num_shards + 1`` values)."""
    return [int(b) for b in np.linspace(0, num_rows, num_shards + 1).astype(np.int64)]


class FlatShards:
    """Row shards of a ``(ntotal, dim)`` vector matrix, one per device.

    Args:
        vectors: float32 torch tensor ``(ntotal, dim)`` on the CPU.
        devices: where the shards live, e.g. ``["cuda:0", "cuda:1"]`` or ``["cpu"]``.
        dtype: shard precision (``torch.float16`` on GPUs halves memory, as FAISS's ``useFloat16``).

    Raises:
        ValueError: no devices given.
    """

    def __init__(self, vectors, devices: Sequence[str], dtype=None):
        import torch

        if not devices:
            raise ValueError("FlatShards needs at least one device")
        dtype = dtype or vectors.dtype
        bounds = shard_bounds(vectors.shape[0], len(devices))
        # A CPU float32 shard stays a zero-copy view of the caller's memory (e.g. a FAISS index).
        shards = [vectors[lo:hi].to(device=torch.device(dev), dtype=dtype)
                  for dev, lo, hi in zip(devices, bounds[:-1], bounds[1:])]
        self._set(shards, bounds[:-1])

    @classmethod
    def from_shards(cls, shards: list, offsets: list[int]) -> "FlatShards":
        """Wrap already placed ``(rows_i, dim)`` tensors whose first rows are ``offsets``."""
        self = cls.__new__(cls)
        self._set(shards, offsets)
        return self

    def _set(self, shards: list, offsets: list[int]) -> None:
        self.shards, self.offsets = shards, [int(o) for o in offsets]

    @property
    def devices(self) -> list[str]:
        return [str(s.device) for s in self.shards]

    @property
    def ntotal(self) -> int:
        return int(sum(s.shape[0] for s in self.shards))

    @property
    def dim(self) -> int:
        return int(self.shards[0].shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of vector storage over all shards."""
        return int(sum(s.numel() * s.element_size() for s in self.shards))

    def search(self, queries: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``topk`` inner products over all shards.

        All shards are searched before any result is copied back, so GPU shards work in parallel.

        Args:
            queries: float32 ``(num_queries, dim)``.
            topk: at most the number of stored vectors.
        Returns:
            float32 scores and int64 row ids, both ``(num_queries, topk)``, best first.
        """
        import torch

        with torch.inference_mode():
            query = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
            partial = []
            for offset, shard in zip(self.offsets, self.shards):
                k = min(topk, shard.shape[0])
                if k:
                    q = query.to(shard.device, shard.dtype, non_blocking=True)
                    partial.append(_shard_topk(q, shard, k, offset))
            scores = torch.cat([s.float().cpu() for s, _ in partial], dim=1)
            ids = torch.cat([i.cpu() for _, i in partial], dim=1)
            if len(partial) > 1:
                scores, order = torch.topk(scores, topk, dim=1)
                ids = torch.gather(ids, 1, order)
        return scores.numpy(), ids.numpy()


def _shard_topk(query, shard, k: int, offset: int):
    """Top-``k`` of ``query @ shard.T`` in row blocks, so the score matrix stays within budget."""
    import torch

    budget = SCORE_BUDGET_BYTES["cpu" if shard.device.type == "cpu" else "cuda"]
    block = max(4096, budget // max(1, query.shape[0] * shard.element_size()))
    if shard.shape[0] <= block:
        scores, ids = torch.topk(query @ shard.T, k, dim=1)
        return scores, ids + offset
    all_scores, all_ids = [], []
    for lo in range(0, shard.shape[0], block):
        part = shard[lo:lo + block]
        scores, ids = torch.topk(query @ part.T, min(k, part.shape[0]), dim=1)
        all_scores.append(scores)
        all_ids.append(ids + lo)
    scores, order = torch.topk(torch.cat(all_scores, dim=1), k, dim=1)
    return scores, torch.gather(torch.cat(all_ids, dim=1), 1, order) + offset


def load_flat_shards(flat: FlatFile, devices: Sequence[str], dtype=None, threads: int = STAGING_BUFFERS,
                     staging_bytes: int = STAGING_BYTES) -> FlatShards:
    """Read a FAISS Flat file into row shards on ``devices`` without a full host copy.

    A float32 CPU shard is read straight into its own memory by ``threads`` readers. Any other shard
    (GPU, or another dtype) is filled through ``threads`` staging chunks of ``staging_bytes`` (pinned
    when CUDA is used), read in parallel ahead of the chunk being copied and converted on its device.
    Peak host memory: the staging chunks plus CPU shards.

    Args:
        flat: the file (``flat_file.open_flat_file``).
        devices: one shard per entry, e.g. ``visible_gpus()`` or ``["cpu"]``.
        dtype: shard dtype; default float32 on the CPU, float16 elsewhere.
    Raises:
        ValueError: no devices.
        FlatFileError: the file shrank while being read.
    """
    import torch

    if not devices:
        raise ValueError("load_flat_shards needs at least one device")
    bounds = shard_bounds(flat.ntotal, len(devices))
    shards = []
    for dev, lo, hi in zip(devices, bounds[:-1], bounds[1:]):
        device = torch.device(dev)
        shard_dtype = dtype or (torch.float32 if device.type == "cpu" else torch.float16)
        shards.append(torch.empty((hi - lo, flat.dim), dtype=shard_dtype, device=device))
    direct = [s.device.type == "cpu" and s.dtype == torch.float32 for s in shards]
    for shard, lo, is_direct in zip(shards, bounds, direct):
        if is_direct and shard.shape[0]:
            flat.read_parallel(lo, shard.numpy(), threads)
    staged = [(s, lo) for s, lo, d in zip(shards, bounds, direct) if not d and s.shape[0]]
    if staged:
        _fill_staged(flat, staged, threads, staging_bytes)
    return FlatShards.from_shards(shards, bounds[:-1])


def _fill_staged(flat: FlatFile, staged: list, num_buffers: int, staging_bytes: int) -> None:
    """Copy rows into non-float32-CPU shards through a ring of staging buffers."""
    import torch

    use_cuda = any(s.device.type == "cuda" for s, _ in staged)
    rows = max(1, staging_bytes // flat.row_bytes)
    jobs = [(shard, first, lo, min(lo + rows, first + shard.shape[0]))
            for shard, first in staged for lo in range(first, first + shard.shape[0], rows)]
    num_buffers = max(1, min(num_buffers, len(jobs)))
    buffers = [torch.empty((rows, flat.dim), dtype=torch.float32, pin_memory=use_cuda)
               for _ in range(num_buffers)]
    done_events = [None] * num_buffers

    def read(i: int) -> None:
        _, _, lo, hi = jobs[i]
        flat.read_into(lo, buffers[i % num_buffers][:hi - lo].numpy())

    with ThreadPoolExecutor(num_buffers) as pool:
        pending = deque(pool.submit(read, i) for i in range(num_buffers))
        for i, (shard, first, lo, hi) in enumerate(jobs):
            pending.popleft().result()
            slot = i % num_buffers
            source = buffers[slot][:hi - lo]
            if shard.device.type == "cuda":
                with torch.cuda.device(shard.device):
                    # Convert on the GPU: copy the float32 chunk over, then cast into the shard.
                    shard[lo - first:hi - first].copy_(source.to(shard.device, non_blocking=True))
                    done_events[slot] = torch.cuda.Event()
                    done_events[slot].record()
            else:
                shard[lo - first:hi - first].copy_(source)
            nxt = i + num_buffers
            if nxt < len(jobs):
                if done_events[slot] is not None:
                    done_events[slot].synchronize()  # the buffer's copy must finish before reuse
                pending.append(pool.submit(read, nxt))
    if use_cuda:
        for shard, _ in staged:
            if shard.device.type == "cuda":
                torch.cuda.synchronize(shard.device)


def visible_gpus() -> list[str]:
    """``["cuda:0", ...]`` for every GPU torch can see (empty without CUDA)."""
    import torch

    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
