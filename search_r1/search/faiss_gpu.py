"""FAISS's own GPU indexes, used by ``--faiss_gpu`` when the installed FAISS is a GPU build.

PyPI's ``faiss-gpu-cuvs`` (CUDA 13, with cuVS) and ``faiss-gpu`` (CUDA 12) provide them; the default
``faiss-cpu`` does not, and then ``flat_shards`` serves Flat indexes with torch instead.

- A Flat file is read in chunks (``flat_file``) into one fp16 ``GpuIndexFlat`` per GPU (an
  ``IndexShards`` over several GPUs, rows split like ``index_cpu_to_all_gpus(shard=True)``), so the
  host never holds the whole index.
- Any other index (IVF, PQ, CAGRA saved as ``IndexHNSWCagra``) is read by FAISS and cloned to the GPUs,
  sharded, with fp16 where the index type supports it.
"""

from __future__ import annotations

from typing import Sequence

from .flat_file import METRIC_INNER_PRODUCT, FlatFile
from .flat_shards import shard_bounds

CHUNK_BYTES = 256 << 20  # rows handed to GpuIndexFlat.add at a time


def faiss_has_gpu() -> bool:
    """Whether the installed FAISS is a GPU build that sees at least one GPU."""
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def faiss_has_cagra() -> bool:
    """Whether the installed FAISS has cuVS CAGRA (``faiss-gpu-cuvs``)."""
    import faiss

    return hasattr(faiss, "GpuIndexCagra") and faiss_has_gpu()


def flat_file_to_gpus(flat: FlatFile, gpus: Sequence[int], use_float16: bool = True):
    """A FAISS GPU Flat index holding the file's rows, sharded over ``gpus``.

    Returns:
        a ``GpuIndexFlatIP``/``GpuIndexFlatL2`` (one GPU) or an ``IndexShards`` of them, with
        ``ntotal == flat.ntotal``; its GPU resources are kept alive on ``referenced_objects``.
    Raises:
        ValueError: no GPUs given.
    """
    import faiss

    if not gpus:
        raise ValueError("flat_file_to_gpus needs at least one GPU")
    bounds = shard_bounds(flat.ntotal, len(gpus))
    chunk_rows = max(1, CHUNK_BYTES // flat.row_bytes)
    keep, subs = [], []
    for gpu, lo, hi in zip(gpus, bounds[:-1], bounds[1:]):
        resources = faiss.StandardGpuResources()
        config = faiss.GpuIndexFlatConfig()
        config.device, config.useFloat16 = int(gpu), use_float16
        cls = faiss.GpuIndexFlatIP if flat.metric_type == METRIC_INNER_PRODUCT else faiss.GpuIndexFlatL2
        sub = cls(resources, flat.dim, config)
        if hasattr(sub, "reserveMemory"):
            sub.reserveMemory(hi - lo)  # one allocation instead of repeated growth
        for _, rows in flat.iter_chunks(chunk_rows, lo, hi):
            sub.add(rows)
        keep += [resources, sub]
        subs.append(sub)
    if len(subs) == 1:
        index = subs[0]
    else:
        index = faiss.IndexShards(flat.dim, True, True)  # threaded, successive ids
        for sub in subs:
            index.add_shard(sub)
        index.syncWithSubIndexes()
    index.referenced_objects = keep
    return index


def index_to_gpus(index, gpus: Sequence[int], use_float16: bool = True):
    """Clone a CPU FAISS index to ``gpus``, sharded (``index_cpu_to_gpus_list``).

    Raises:
        ValueError: FAISS has no GPU form of this index type (e.g. ``IndexHNSWFlat``).
    """
    import faiss

    options = faiss.GpuMultipleClonerOptions()
    options.useFloat16 = use_float16
    options.shard = True
    try:
        return faiss.index_cpu_to_gpus_list(index, co=options, gpus=list(gpus))
    except RuntimeError as err:
        raise ValueError(f"FAISS has no GPU implementation of {type(index).__name__} ({err}); serve it "
                         f"without --faiss_gpu, or build a GPU type (Flat, IVF..., CAGRA)") from None


def set_search_params(index, params: dict | None, on_gpu: bool) -> None:
    """Apply search-time parameters (``{"nprobe": 64}``, ``{"efSearch": 128}``) to a FAISS index.

    Raises:
        ValueError: a parameter the index does not have.
    """
    if not params:
        return
    import faiss

    space = faiss.GpuParameterSpace() if on_gpu else faiss.ParameterSpace()
    for name, value in params.items():
        try:
            space.set_index_parameter(index, name, float(value))
        except RuntimeError as err:
            raise ValueError(f"search parameter {name}={value} does not apply to "
                             f"{type(index).__name__}: {err}") from None
