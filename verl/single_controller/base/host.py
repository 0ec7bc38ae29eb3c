"""The per-rank process body: holds the worker object of every colocated role of one rank.

A Ray backend runs one ``WorkerHost`` actor per rank; the local backend keeps one in the
controller process. Hosting several roles (actor/rollout + reference, optionally the critic) in
one host is what colocation means here: they share the process, the device and the
``torch.distributed`` group, so weights move between them without a network hop.
"""

from __future__ import annotations

import os
import socket
import traceback
from dataclasses import dataclass
from typing import Any


class ClassWithInitArgs:
    """A worker class and the arguments to build it with, built later inside the rank's process."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        # veRL passes ray.remote(WorkerCls); accept that and keep the plain class.
        self.cls = getattr(cls, "__ray_actor_class__", cls)
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cls.__name__}, args={self.args!r}, kwargs={self.kwargs!r})"

    def build(self) -> Any:
        return self.cls(*self.args, **self.kwargs)


@dataclass
class ColocatedClassWithInitArgs:
    """Several roles to host together in each rank's process: ``{role: ClassWithInitArgs}``."""

    roles: dict[str, ClassWithInitArgs]


def create_colocated_worker_cls(class_dict: dict[str, ClassWithInitArgs]) -> ColocatedClassWithInitArgs:
    """Bundles roles (e.g. ``{"actor_rollout": ..., "ref": ..., "critic": ...}``) so that one worker
    group starts each rank's roles in one process; ``group.spawn(prefix_set=...)`` then gives one
    group per role over the shared processes (veRL's ``create_colocated_worker_cls``).

    Raises:
        ValueError: ``class_dict`` is empty, or a role name is not an identifier (it prefixes
            method names).
    """
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    for role, spec in class_dict.items():
        if not role.isidentifier():
            raise ValueError(f"role name {role!r} must be a Python identifier")
        if not isinstance(spec, ClassWithInitArgs):
            raise ValueError(f"role {role!r}: expected a ClassWithInitArgs, got {type(spec).__name__}")
    return ColocatedClassWithInitArgs(roles=dict(class_dict))


class WorkerHost:
    """Builds and calls the role workers of one rank (``init_workers`` then ``call``)."""

    def __init__(self, roles: dict[str, ClassWithInitArgs]) -> None:
        self._roles = roles
        self.workers: dict[str, Any] = {}

    def node_address(self) -> tuple[str, int]:
        """An address other ranks can reach and a free TCP port on it (for rank 0's rendezvous)."""
        return reachable_address()

    def node_id(self) -> str:
        """Ray's id of the node this rank runs on ("" outside Ray): where the rank was placed."""
        try:
            import ray

            return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        except ImportError:
            return ""

    def init_workers(self, env: dict[str, str]) -> int:
        """Sets the rank's environment, then builds each role's worker (in role order). Returns the pid."""
        os.environ.update(env)
        for role, spec in self._roles.items():
            try:
                self.workers[role] = spec.build()
            except Exception as error:
                error.remote_traceback = traceback.format_exc()
                raise
        return os.getpid()

    def call(self, role: str, method: str, args: tuple, kwargs: dict) -> Any:
        """Runs ``workers[role].method(*args, **kwargs)``.

        An exception leaves with its full formatted traceback in ``remote_traceback`` (exception
        attributes survive pickling), so the controller can show where the worker failed.
        """
        try:
            return getattr(self.workers[role], method)(*args, **kwargs)
        except Exception as error:
            error.remote_traceback = traceback.format_exc()
            raise


def reachable_address() -> tuple[str, int]:
    """This node's address as other Ray nodes reach it (127.0.0.1 outside Ray) and a free TCP port."""
    try:
        import ray

        ip = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    except ImportError:
        ip = "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return ip, sock.getsockname()[1]
