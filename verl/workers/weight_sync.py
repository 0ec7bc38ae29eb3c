"""The actor's weights to rollout engines on devices of their own (``actor_rollout_ref.hybrid_engine=false``).

With split pools the FSDP actor and the rollout engines live in different processes, usually on
different GPUs, so the in-memory push of the hybrid engine is not available. After each update the
actor's rank 0 broadcasts the full weights over a process group of its own with every rollout rank:
NCCL between GPUs (device to device, no host copy), gloo on CPU-only machines. The group is made
directly from a ``TCPStore`` that the actor's rank 0 hosts, apart from the default group each side
uses for FSDP or its engine (a process has one default group; veRL's one-step-off-policy recipe and
TRL's vLLM server make such a side group the same way, with vLLM's stateless group).

Each push is one "version": rank 0 writes the list of ``(name, shape, dtype)`` into the store under
the version's key, then broadcasts the tensors in that order; a receiver reads the list, allocates
each tensor and receives into it, handing them to its engine one at a time. The sender holds one
gathered tensor at a time; an engine may keep every received tensor until it loads them (vLLM's push
does: a full copy of the weights beside its own, and one more when served from a child process).
A push is sent only while no engine generates (the trainer waits for the rollout in flight first),
so its collectives never wait on a rollout and a short timeout bounds a lost peer.
"""

from __future__ import annotations

import datetime
import pickle
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

DTYPE_KEY = "engine_weight_dtype"


@dataclass(frozen=True)
class TensorSpec:
    """What a receiver allocates for one pushed tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class WeightBroadcast:
    """Rank 0 (the actor's rank 0) sends full weights; ranks 1..N (the rollout ranks) receive them.

    Args:
        host, port: the ``TCPStore`` of rank 0 (rank 0 starts it there; others connect to it).
        rank: this process's rank in the group (0: the sender).
        world_size: 1 + the rollout ranks.
        use_gpu: NCCL on the current CUDA device (else gloo on CPU tensors).
        timeout_s: how long the set-up or a collective may wait for the other side (a peer that is
            gone, an address no node reaches).
        engine_dtype: a receiver's engine dtype, which rank 0 casts floating-point weights to before
            sending (rank 1 publishes it at start; rank 0 reads it).

    Raises:
        RuntimeError: the store or the group cannot be set up within ``timeout_s`` (naming the address).
    """

    def __init__(self, host: str, port: int, rank: int, world_size: int, use_gpu: bool, timeout_s: float = 600.0,
                 engine_dtype: torch.dtype | None = None) -> None:
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(f"weight sync: rank {rank} of world_size {world_size} (one sender, >= 1 receiver)")
        self.rank, self.world_size, self.use_gpu = rank, world_size, use_gpu
        self.device = torch.device("cuda", torch.cuda.current_device()) if use_gpu else torch.device("cpu")
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            self.store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout)
            self.group = _process_group(self.store, rank, world_size, use_gpu, timeout)
        except Exception as error:  # noqa: BLE001  (the address is what the user can check)
            raise RuntimeError(f"weight sync: rank {rank} of {world_size} could not join the group at "
                               f"{host}:{port}: {error}") from error
        if rank == 1:  # "": an engine that takes the actor's dtype as it is
            self.store.set(DTYPE_KEY, "" if engine_dtype is None else str(engine_dtype).removeprefix("torch."))
        name = self.store.get(DTYPE_KEY).decode()
        self.engine_dtype = getattr(torch, name) if name else None
        self.version = 0

    def send(self, specs: list[TensorSpec], tensors: Iterable[torch.Tensor]) -> int:
        """Broadcast ``tensors`` (rank 0), described by ``specs`` in the same order.

        Returns:
            The bytes sent.
        Raises:
            ValueError: a tensor that does not match its spec (name, shape or dtype).
        """
        self.version += 1
        self.store.set(f"specs/{self.version}", pickle.dumps(specs))
        if self.version > 1:  # every receiver read the previous list before that push completed
            self.store.delete_key(f"specs/{self.version - 1}")
        sent = 0
        for spec, tensor in zip(specs, tensors, strict=True):
            if tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
                raise ValueError(f"weight sync: {spec.name} is {tuple(tensor.shape)} {tensor.dtype}, its spec "
                                 f"{spec.shape} {spec.dtype}")
            tensor = tensor.to(self.device).contiguous()
            self.group.broadcast(tensor, 0).wait()
            sent += tensor.numel() * tensor.element_size()
        return sent

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The next push's ``(name, tensor)`` pairs, each received as it is consumed (ranks >= 1).

        All of them must be consumed: the sender waits for every receiver at each tensor.
        """
        self.version += 1
        specs: list[TensorSpec] = pickle.loads(self.store.get(f"specs/{self.version}"))
        for spec in specs:
            tensor = torch.empty(spec.shape, dtype=spec.dtype, device=self.device)
            self.group.broadcast(tensor, 0).wait()
            yield spec.name, tensor
        if self.use_gpu:  # the push's time ends when the data is there (NCCL's wait only orders the stream)
            torch.cuda.synchronize(self.device)


def _process_group(store, rank: int, world_size: int, use_gpu: bool, timeout: datetime.timedelta):
    """A process group on ``store`` outside ``torch.distributed``'s registry (the default group
    stays the process's own)."""
    prefixed = dist.PrefixStore("weight_sync/", store)
    if use_gpu:
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)


def state_specs(model: torch.nn.Module, dtype: torch.dtype | None) -> list[TensorSpec]:
    """The specs of what ``fsdp_utils.iter_full_params(model, dtype=dtype)`` yields, without
    gathering (a sharded tensor's shape is the full one)."""
    specs = []
    for name, tensor in model.state_dict().items():
        cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        specs.append(TensorSpec(name, tuple(tensor.shape), cast))
    return specs


def specs_of(named: dict[str, torch.Tensor]) -> list[TensorSpec]:
    """The specs of materialised tensors (a LoRA actor's merged weights)."""
    return [TensorSpec(name, tuple(tensor.shape), tensor.dtype) for name, tensor in named.items()]
