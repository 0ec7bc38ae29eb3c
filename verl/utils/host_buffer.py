"""One exact-size host buffer for a set of tensors that moves between the host and a GPU
(:class:`HostBuffer`), page-locked so that both directions are asynchronous DMA; and the DTensor
helpers its users share (:func:`local_shard`, :func:`with_local`).

Used by the optimizer state's offload (:mod:`verl.utils.optimizer_offload`) and by a module's
``param_offload`` (:func:`verl.utils.fsdp_utils.offload_model`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import weakref
from typing import Sequence

import torch

logger = logging.getLogger(__name__)

# Each tensor's slice of a buffer starts on this boundary: a view of any dtype is aligned, and so is each DMA.
ALIGN_BYTES = 512


class HostBuffer:
    """A host buffer with one slot (a typed view) per entry of a layout, kept while the layout holds.

    A layout is a sequence of entries whose last two items are ``(shape, dtype)``; what comes before
    them names the tensor (a parameter's name, an optimizer state's index and key) so that two
    layouts compare equal only when the same tensors have the same local shapes and dtypes.
    :meth:`slots` allocates on the first call and again when the layout changed, otherwise it
    returns the same views. The buffer is exactly as large as the tensors (plus
    :data:`ALIGN_BYTES` alignment each) and, with ``page_lock``, registered with
    ``cudaHostRegister``: PyTorch's pinned allocator would round it up to a power of two, up to 2x
    the host memory. Where registration fails the buffer stays pageable (correct, slower; logged once).

    Args:
        page_lock: register the buffer with CUDA (the tensors come from and go to a GPU). False on a
            CPU-only machine, where the buffer is plain host memory.
    """

    def __init__(self, page_lock: bool):
        self.page_lock = page_lock
        self._buffer: torch.Tensor | None = None  # (nbytes,) uint8
        self._layout: tuple = ()
        self._slots: list[torch.Tensor] = []
        self._registration: weakref.finalize | None = None  # unregisters the buffer

    @property
    def tensor(self) -> torch.Tensor | None:
        """The buffer itself, ``(nbytes,)`` uint8 (None before the first :meth:`slots`)."""
        return self._buffer

    @property
    def page_locked(self) -> bool:
        """Whether the buffer is registered with CUDA now."""
        return self._registration is not None and self._registration.alive

    def slots(self, layout: Sequence[tuple]) -> list[torch.Tensor]:
        """One view of the buffer per ``layout`` entry ``(*name, shape, dtype)``, in order; a new
        buffer if the layout differs from the last call's (views of the old one stay valid, pageable)."""
        layout = tuple(layout)
        if layout != self._layout or self._buffer is None:
            self._allocate(layout)
        return self._slots

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` (a plain tensor, not a DTensor) is a view of the buffer."""
        return (self._buffer is not None and tensor.device.type == "cpu"
                and tensor.untyped_storage().data_ptr() == self._buffer.untyped_storage().data_ptr())

    def release(self) -> None:
        """Unregister and drop the buffer (views of it stay valid, pageable)."""
        if self._registration is not None:
            self._registration()
        self._buffer, self._layout, self._slots, self._registration = None, (), [], None

    def _allocate(self, layout: tuple) -> None:
        self.release()
        nbytes = [math.prod(shape) * dtype.itemsize for *_, shape, dtype in layout]
        offsets = [0]
        for size in nbytes:
            offsets.append(offsets[-1] + -(-size // ALIGN_BYTES) * ALIGN_BYTES)
        buffer = torch.empty(offsets[-1], dtype=torch.uint8)
        self._slots = [buffer[offset:offset + size].view(dtype).view(shape)
                       for offset, size, (*_, shape, dtype) in zip(offsets, nbytes, layout)]
        self._buffer, self._layout = buffer, layout
        if self.page_lock and buffer.numel():
            self._registration = _page_lock(buffer, owner=self)


def local_shard(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return value.to_local() if isinstance(value, DTensor) else value


def with_local(value: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
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
    logger.warning("cudaHostRegister failed (cudaError %d): a host buffer stays in pageable memory, and the "
                   "moves through it are slower", error)
