"""Backend-independent parts of the single controller: dispatch modes, Worker, WorkerGroup."""

from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.base.host import ClassWithInitArgs, create_colocated_worker_cls
from verl.single_controller.base.worker import Worker
from verl.single_controller.base.worker_group import (
    PendingCall,
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
    WorkerNodeLostError,
    WorkerOutOfMemoryError,
    WorkerTimeoutError,
)

__all__ = [
    "ClassWithInitArgs",
    "Dispatch",
    "PendingCall",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerNodeLostError",
    "WorkerOutOfMemoryError",
    "WorkerTimeoutError",
    "create_colocated_worker_cls",
    "register",
]
