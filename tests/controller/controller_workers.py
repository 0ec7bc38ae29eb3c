"""Worker classes the controller tests run in real Ray actors (importable by the actors)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register


class SumWorker(Worker):
    """Joins a gloo group at init; exercises every dispatch mode."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.init_process_group(use_gpu=False)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self, offset: float) -> float:
        """Sum over ranks of (rank + offset), computed with a real all_reduce."""
        value = torch.tensor([self.rank + offset], dtype=torch.float64)
        dist.all_reduce(value)
        return float(value.item())

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double_and_tag(self, data: DataProto) -> DataProto:
        """Rows of ``x`` times ``2 * scale``, tagged with the rank and chunk size that computed them."""
        n = len(data)
        return DataProto.from_dict(
            tensors={"y": data.batch["x"] * 2 * self.scale, "rank": torch.full((n,), self.rank)},
            non_tensors={"uid_out": list(data.non_tensor_batch["uid"])},
            meta_info={"chunk_rows": n},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def two_samples_per_row(self, data: DataProto) -> DataProto:
        """Two output rows per input row (like rollout.n = 2 inside the worker)."""
        return DataProto.from_dict(tensors={"y": data.batch["x"]}).repeat(2, interleave=True)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def echo_with_rank(self, value: int) -> tuple[int, int]:
        return self.rank, value

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def only_rank_zero(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def slow_pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on_rank(self, bad_rank: int) -> int:
        if self.rank == bad_rank:
            raise ValueError(f"deliberate failure on rank {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_on_rank_while_others_wait(self, bad_rank: int, release_path: str) -> int:
        """``bad_rank`` exits; the others return only once ``release_path`` exists."""
        if self.rank == bad_rank:
            os._exit(3)
        while not os.path.exists(release_path):
            time.sleep(0.05)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def hang_in_collective_unless_rank(self, skip_rank: int) -> int:
        """Every rank but ``skip_rank`` waits in a barrier that cannot complete."""
        if self.rank != skip_rank:
            dist.barrier()
        return self.rank


class ActorRole(Worker):
    """Stand-in for an actor/rollout role: holds a weight tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.init_process_group(use_gpu=False)
        self.weight = torch.full((3,), float(self.rank + 1))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_sum(self) -> float:
        return float(self.weight.sum())


class RefRole(Worker):
    """Stand-in for the reference role, colocated with :class:`ActorRole`."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.init_process_group(use_gpu=False)  # a no-op: the actor role already joined
        self.factor = factor

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def scaled(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"ref": data.batch["x"] * self.factor})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def world(self) -> int:
        return dist.get_world_size()


class MemoryHog(Worker):
    """Allocates host memory step by step, as a run that outgrows the machine does."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def grow(self, cap_gib: float, step_mib: int = 64) -> float:
        """Hold ``step_mib`` more MiB every 50 ms (pages touched) up to ``cap_gib``; returns the GiB held."""
        held, size = [], step_mib << 20
        while len(held) * step_mib < cap_gib * 1024:
            block = bytearray(size)
            block[::4096] = b"\1" * (size // 4096)  # write every page: memory used, not only reserved
            held.append(block)
            time.sleep(0.05)
        return len(held) * step_mib / 1024


class BrokenInitWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        raise RuntimeError(f"cannot start rank {self.rank}")
