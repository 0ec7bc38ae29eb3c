"""The optimizer state on the host between updates (``fsdp_config.optimizer_offload``), in one
page-locked host buffer kept from step to step (:class:`OptimizerOffload`)."""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import weakref

import torch

logger = logging.getLogger(__name__)

# Each state tensor's slice of the host buffer starts on this boundary: a view of any dtype is aligned, and
# so is each DMA.
_HOST_ALIGN_BYTES = 512


class OptimizerOffload:
    """An optimizer's state on the host between updates (veRL's ``fsdp_config.optimizer_offload``),
    in one page-locked host buffer that is kept from step to step.

    :meth:`offload` copies every state tensor on ``device`` into its slice of the buffer and points
    the state entry at that slice; :meth:`load` puts a device copy of each slice back. From
    page-locked memory both directions are asynchronous DMA, ordered on the current stream with the
    optimizer step, and nothing is allocated on the host per step (a fresh pageable ``.to("cpu")``
    per tensor faults in new host memory on every update and copies synchronously both ways).

    The buffer is allocated on the first :meth:`offload`, and again when the state's layout (which
    parameter, key, local shape, dtype) changed, e.g. after ``optimizer.load_state_dict``. It is
    exactly as large as the state (plus alignment) and page-locked with ``cudaHostRegister``:
    PyTorch's pinned allocator would round it up to a power of two, up to 2x the host memory. Where
    registration fails the buffer stays pageable (correct, slower; logged once).

    FSDP2's state tensors are DTensors: the local shard is what is copied, and the entry stays a
    DTensor of the same mesh, placements, shape and stride, as ``value.to("cpu")`` leaves it.
    Scalars that live on the host already (AdamW's ``step``) are not touched.

    Args:
        optimizer: the optimizer whose ``state`` moves.
        device: where the state lives for a step (the rank's GPU). A CPU ``device`` makes both moves
            plain host copies, so a CPU-only machine can drive the whole cycle (tests); nothing is
            page-locked then.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: str | torch.device):
        self.optimizer = optimizer
        self.device = torch.device(device)
        self._buffer: torch.Tensor | None = None  # (nbytes,) uint8 on the host
        self._layout: tuple = ()
        self._slots: list[torch.Tensor] = []  # one view of the buffer per layout entry
        self._registration: weakref.finalize | None = None  # unregisters the buffer

    @torch.no_grad()
    def offload(self) -> None:
        """Copy the state tensors on ``device`` into the host buffer; the entries become its views.

        Blocks until the copies have landed, so the host may read the state after it (a checkpoint).
        """
        entries = self._entries()
        if not entries:  # AdamW creates its state in the first step
            return
        layout = tuple((index, key, tuple(_local(value).shape), _local(value).dtype)
                       for index, key, _, value in entries)
        if layout != self._layout:
            self._allocate(layout)
        for (_, key, state, value), slot in zip(entries, self._slots):
            local = _local(value)
            if local.data_ptr() != slot.data_ptr():  # not offloaded already
                slot.copy_(local, non_blocking=True)
                state[key] = _with_local(value, slot)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def load(self) -> None:
        """Put a ``device`` copy of each state tensor in the buffer back into the state (asynchronous
        from page-locked memory, ordered before the step on the current stream); the buffer is kept."""
        for _, key, state, value in self._entries():
            if self._holds(value) or value.device.type != self.device.type:
                state[key] = value.to(self.device, non_blocking=True, copy=True)

    def _entries(self) -> list[tuple[int, str, dict, torch.Tensor]]:
        """``(parameter index, key, state dict, tensor)`` of the tensors the buffer is for (all but the
        host scalars), in parameter order."""
        params = (p for group in self.optimizer.param_groups for p in group["params"])
        entries = []
        for index, param in enumerate(params):
            state = self.optimizer.state.get(param, {})
            for key in sorted(state):
                value = state[key]
                # host scalars (AdamW's ``step``) stay where the optimizer keeps them
                if torch.is_tensor(value) and (value.device.type == self.device.type or value.dim() > 0):
                    entries.append((index, key, state, value))
        return entries

    def _holds(self, value: torch.Tensor) -> bool:
        """Whether ``value`` is a view of the buffer."""
        return (self._buffer is not None and value.device.type == "cpu"
                and _local(value).untyped_storage().data_ptr() == self._buffer.untyped_storage().data_ptr())

    def _allocate(self, layout: tuple) -> None:
        """A new buffer with one slice per ``layout`` entry ``(index, key, shape, dtype)``; the old
        one is given up (views of it stay valid, pageable)."""
        self._release()
        nbytes = [math.prod(shape) * dtype.itemsize for *_, shape, dtype in layout]
        offsets = [0]
        for size in nbytes:
            offsets.append(offsets[-1] + -(-size // _HOST_ALIGN_BYTES) * _HOST_ALIGN_BYTES)
        buffer = torch.empty(offsets[-1], dtype=torch.uint8)
        self._slots = [buffer[offset:offset + size].view(dtype).view(shape)
                       for offset, size, (*_, shape, dtype) in zip(offsets, nbytes, layout)]
        self._buffer, self._layout = buffer, layout
        if self.device.type == "cuda" and buffer.numel():
            self._registration = _page_lock(buffer, owner=self)

    def _release(self) -> None:
        if self._registration is not None:
            self._registration()
        self._buffer, self._layout, self._slots, self._registration = None, (), [], None


def _local(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return value.to_local() if isinstance(value, DTensor) else value


def _with_local(value: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` in place of ``value``: a DTensor with ``value``'s spec around it if ``value`` is one."""
    from torch.distributed.tensor import DTensor

    if not isinstance(value, DTensor):
        return local
    # What DTensor's own ops (``value.to("cpu")``) build; DTensor.from_local would copy a host shard to
    # the mesh's device type.
    return DTensor(local, value._spec, requires_grad=value.requires_grad)


def _page_lock(buffer: torch.Tensor, owner: object) -> weakref.finalize | None:
    """Page-lock ``buffer`` (exact size) until ``owner`` is collected or the returned finalizer is
    called; None, with a warning once, where CUDA refuses."""
    error = torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel(), 0)
    if int(error) != 0:
        _clear_cuda_error()
        _warn_pageable(int(error))
        return None
    # The finalizer holds the buffer, so its memory outlives the registration.
    registration = weakref.finalize(owner, _unregister, buffer)
    registration.atexit = False  # the process's end releases it; CUDA may be gone by then
    return registration


def _unregister(buffer: torch.Tensor) -> None:
    torch.cuda.synchronize()  # a load's copies may still be reading the buffer
    torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())


def _clear_cuda_error() -> None:
    """Reset the CUDA runtime's last error, which a refused ``cudaHostRegister`` leaves set: PyTorch's
    next kernel-launch check would raise it. Through the libcudart that is loaded, as PyTorch exposes
    no ``cudaGetLastError``."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libcudart.so" in line}
    for path in paths:
        ctypes.CDLL(path).cudaGetLastError()


@functools.cache
def _warn_pageable(error: int) -> None:
    logger.warning("cudaHostRegister failed (cudaError %d): the optimizer state stays in pageable host memory, "
                   "and its moves between updates are slower", error)
