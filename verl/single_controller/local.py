"""In-process worker group (``trainer.backend=local``): world size 1, no Ray, easy to debug.

The same worker classes and calls as :class:`~verl.single_controller.ray.RayWorkerGroup`: the
methods run in the controller process through the same dispatch and collect code, so a
``DP_COMPUTE_PROTO`` call returns what the Ray group returns. The rank environment is set so
``Worker.init_process_group`` builds a 1-rank gloo group.
"""

from __future__ import annotations

import os
import traceback
from typing import Any, Callable

import torch.distributed as dist

from verl.single_controller.base.decorator import CallPlan
from verl.single_controller.base.host import ClassWithInitArgs, ColocatedClassWithInitArgs, WorkerHost
from verl.single_controller.base.worker import RANK_ENV_VARS, _free_port, restore_env
from verl.single_controller.base.worker_group import WorkerError, WorkerGroup, role_classes_of


class LocalWorkerGroup(WorkerGroup):
    """Hosts the roles of ``cls_with_init`` in this process as rank 0 of 1.

    Args:
        cls_with_init: a :class:`ClassWithInitArgs` or a colocated bundle
            (:func:`create_colocated_worker_cls`).

    Errors raised by a worker method are re-raised as :class:`WorkerError` (rank 0, method,
    traceback) chained to the original exception. There is no timeout: the call runs in this thread.
    """

    def __init__(self, cls_with_init: ClassWithInitArgs | ColocatedClassWithInitArgs) -> None:
        self._role_classes = role_classes_of(cls_with_init)
        self._world_size = 1
        self.timeout_s = float("inf")
        self._host = WorkerHost(self._role_classes)
        had_process_group = dist.is_initialized()
        # the rank environment is this process's own: undone at shutdown, so that a later child
        # (an SFT run, torchrun) does not join a world of one on this group's rendezvous port
        self._env_before = {key: os.environ.get(key) for key in RANK_ENV_VARS}
        try:
            self._host.init_workers(self._rank_env())
        except Exception as error:
            restore_env(self._env_before)
            names = "+".join(spec.cls.__name__ for spec in self._role_classes.values())
            raise WorkerError(0, f"{names}.__init__", traceback.format_exc()) from error
        # only the group whose workers created the 1-rank process group destroys it
        self._owns_process_group = dist.is_initialized() and not had_process_group
        self._bind_all_roles()

    @staticmethod
    def _rank_env() -> dict[str, str]:
        # Keep an existing rendezvous port when a process group already exists in this process.
        port = os.environ.get("MASTER_PORT") if dist.is_initialized() else None
        return {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port or str(_free_port()),
        }

    def _submit(self, role: str, method: str, plan: CallPlan) -> Callable[[], dict[int, Any]]:
        args, kwargs = plan.calls[0]
        try:
            result = self._host.call(role, method, args, kwargs)
        except Exception as error:
            raise WorkerError(0, self._qualified(role, method), traceback.format_exc()) from error
        return lambda: {0: result}

    def shutdown(self) -> None:
        """Drops the workers, destroys the process group their construction made, if any, and puts
        back the rank environment variables as they were before the group."""
        self._host.workers.clear()
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_process_group = False
        restore_env(self._env_before)
