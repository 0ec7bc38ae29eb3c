"""veRL-style single controller: the trainer process drives groups of worker processes.

- :mod:`.base`: ``Worker``, ``@register(dispatch_mode=Dispatch...)``, ``WorkerGroup`` and errors.
- :mod:`.ray`: ``init_ray``, ``RayResourcePool``, ``RayClassWithInitArgs``, ``RayWorkerGroup``
  (one Ray actor per rank), ``create_colocated_worker_cls`` (several roles per process).
- :mod:`.local`: ``LocalWorkerGroup``, the same calls in this process (world size 1).
"""

from verl.single_controller.base import (
    ClassWithInitArgs,
    Dispatch,
    PendingCall,
    Worker,
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
    WorkerNodeLostError,
    WorkerOutOfMemoryError,
    WorkerTimeoutError,
    create_colocated_worker_cls,
    register,
)
from verl.single_controller.local import LocalWorkerGroup
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray

__all__ = [
    "ClassWithInitArgs",
    "Dispatch",
    "LocalWorkerGroup",
    "PendingCall",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerNodeLostError",
    "WorkerOutOfMemoryError",
    "WorkerTimeoutError",
    "create_colocated_worker_cls",
    "init_ray",
    "register",
]
