"""Exact inner-product search over a Flat index's vectors with torch, sharded over devices.

Two uses:
- CPU: one torch matmul + topk beats FAISS's own Flat search on the shared 2-core machine (its
  bundled OpenBLAS and second OpenMP runtime fight torch's threads; 5-7 ms vs ~2 ms per query).
- ``--faiss_gpu`` when the installed FAISS has no GPU support (the PyPI ``faiss-cpu`` wheel; no
  ``faiss-gpu`` wheel matches CUDA 13): the vectors are split row-wise over all visible GPUs in fp16,
  like FAISS's sharded ``index_cpu_to_all_gpus``, and each shard answers with its own top-k, merged
  on the host. The search is the same exact search either way; only the arithmetic precision differs.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def flat_ip_vectors(index):
    """The stored vectors of a CPU ``IndexFlatIP`` as a zero-copy torch ``(ntotal, dim)`` view, else None."""
    import faiss
    import torch

    if type(index) is not faiss.IndexFlatIP or index.ntotal == 0:
        return None
    xb = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)
    return torch.from_numpy(np.asarray(xb).reshape(index.ntotal, index.d))


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
        bounds = np.linspace(0, vectors.shape[0], len(devices) + 1).astype(int)
        self.offsets = [int(b) for b in bounds[:-1]]
        # A CPU float32 shard stays a zero-copy view of the FAISS index's own memory.
        self.shards = [vectors[lo:hi].to(device=torch.device(dev), dtype=dtype)
                       for dev, lo, hi in zip(devices, bounds[:-1], bounds[1:])]

    @property
    def devices(self) -> list[str]:
        return [str(s.device) for s in self.shards]

    def search(self, queries: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``topk`` inner products over all shards.

        Args:
            queries: float32 ``(num_queries, dim)``.
            topk: at most the number of stored vectors.
        Returns:
            float32 scores and int64 row ids, both ``(num_queries, topk)``, best first.
        """
        import torch

        with torch.inference_mode():
            query = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
            all_scores, all_ids = [], []
            for offset, shard in zip(self.offsets, self.shards):
                k = min(topk, shard.shape[0])
                if k == 0:
                    continue
                scores, ids = torch.topk(query.to(shard.device, shard.dtype) @ shard.T, k, dim=1)
                all_scores.append(scores.float().cpu())
                all_ids.append(ids.cpu() + offset)
            scores, ids = torch.cat(all_scores, dim=1), torch.cat(all_ids, dim=1)
            if len(all_scores) > 1:
                scores, order = torch.topk(scores, topk, dim=1)
                ids = torch.gather(ids, 1, order)
        return scores.numpy(), ids.numpy()


def visible_gpus() -> list[str]:
    """``["cuda:0", ...]`` for every GPU torch can see (empty without CUDA)."""
    import torch

    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
