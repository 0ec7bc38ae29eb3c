"""Base class of the processes a worker group drives (one instance per rank and role).

The worker group starts each rank with these environment variables, read here:
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``.
Subclasses call :meth:`Worker.init_process_group` (in ``__init__`` or ``init_model``) before any
collective; roles colocated in one process share the one process group.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

from verl.single_controller.base.decorator import Dispatch, register


#: the variables a worker group sets for each rank (and an in-process group puts back at shutdown)
RANK_ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def restore_env(saved: dict[str, str | None]) -> None:
    """Sets each variable of ``saved`` back to its value there (``None``: removes it)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


class Worker:
    """Rank identity and process-group set-up shared by every worker class.

    Attributes:
        rank, world_size, local_rank, local_world_size: from the environment (0, 1, 0, 1 when unset).
        master_addr, master_port: rendezvous address of rank 0 (``MASTER_ADDR``/``MASTER_PORT``).
    """

    def __init__(self) -> None:
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
        self.master_addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self.master_port = os.environ.get("MASTER_PORT", "")

    def init_process_group(self, use_gpu: bool | None = None, timeout_s: float = 1800.0) -> str:
        """Joins the ``torch.distributed`` default group of all ranks, once per process.

        Args:
            use_gpu: ``True`` uses NCCL for CUDA tensors (and gloo for CPU tensors, which CPU
                offload needs); ``False`` uses gloo only; ``None`` picks ``True`` when CUDA is
                available.
            timeout_s: collective timeout in seconds.

        Returns:
            the backend string in use.

        Raises:
            ValueError: ``use_gpu=True`` without CUDA, or ``MASTER_PORT`` unset with world_size > 1.
        """
        if dist.is_initialized():  # a colocated role already joined in this process
            return str(dist.get_backend())
        if use_gpu is None:
            use_gpu = torch.cuda.is_available()
        if use_gpu and not torch.cuda.is_available():
            raise ValueError(f"rank {self.rank}: init_process_group(use_gpu=True) but CUDA is not available")
        if not self.master_port:
            if self.world_size > 1:
                raise ValueError(f"rank {self.rank}: MASTER_PORT is unset but WORLD_SIZE={self.world_size}")
            self.master_port = str(_free_port())
        backend = "cpu:gloo,cuda:nccl" if use_gpu else "gloo"
        if not use_gpu:
            self._share_cpu_threads()
        if use_gpu:
            # Ray usually exposes one GPU per actor; the modulo also covers a node-wide view.
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{host}:{self.master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        return backend

    def _share_cpu_threads(self) -> None:
        """Give this CPU rank its share of the machine's cores for torch's intra-op threads.

        Ray starts every actor with ``OMP_NUM_THREADS=1`` (its fractional CPU request rounds
        down), which halves a CPU-only actor's forward/backward on a 2-core machine. The share
        is ``cores // LOCAL_WORLD_SIZE``; ``SEARCH_R1_CPU_THREADS`` overrides it.
        """
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = _env_int("SEARCH_R1_CPU_THREADS", max(1, cores // max(1, self.local_world_size)))
        torch.set_num_threads(threads)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def worker_info(self) -> dict:
        """This rank's identity and CPU share: ``{"rank", "world_size", "local_rank", "pid", "hostname",
        "torch_threads"}`` (a diagnostic through the real dispatch path: which process and host each rank
        runs in, and the intra-op threads it took)."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "torch_threads": torch.get_num_threads(),
        }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
