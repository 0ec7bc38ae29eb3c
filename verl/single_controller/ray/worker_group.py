"""Ray backend: one actor per rank, calls fanned out and gathered with a bounded wait."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from typing import Any, Callable

import ray
from ray.exceptions import GetTimeoutError, OutOfMemoryError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.single_controller.base.decorator import CallPlan
from verl.single_controller.base.host import ClassWithInitArgs, ColocatedClassWithInitArgs, WorkerHost
from verl.single_controller.base.worker_group import (
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
    WorkerNodeLostError,
    WorkerOutOfMemoryError,
    WorkerTimeoutError,
    role_classes_of,
)
from verl.single_controller.ray.resource_pool import RankSlot, RayResourcePool


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class, its init arguments and extra Ray actor options (``update_options``)."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        super().__init__(cls, *args, **kwargs)
        self.actor_options: dict[str, Any] = {}

    def update_options(self, options: dict[str, Any]) -> None:
        """Extra ``actor.options(...)`` (e.g. ``runtime_env``) for every rank's actor."""
        self.actor_options.update(options)


class RayWorkerGroup(WorkerGroup):
    """Starts one Ray actor per rank of ``resource_pool`` hosting the roles of ``ray_cls_with_init``.

    Each actor gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` (a free port on rank 0's node) before its workers are
    built, and registered worker methods become methods of the group.

    Args:
        resource_pool: where the ranks run.
        ray_cls_with_init: a :class:`RayClassWithInitArgs`, or several roles bundled by
            :func:`create_colocated_worker_cls` (then ``spawn`` gives per-role groups).
        name_prefix: prefix of the actor names (random when ``None``).
        timeout_s: longest wait, in seconds, for any one call on all ranks (``trainer.worker_timeout_s``).
        init_timeout_s: longest wait for placement and worker construction.

    Errors: a worker that raises gives :class:`WorkerError` (rank, method, remote traceback); a
    worker process that dies gives :class:`WorkerDiedError` as soon as Ray notices (its subclass
    :class:`WorkerOutOfMemoryError` when Ray's memory monitor killed it); no result
    within ``timeout_s`` gives :class:`WorkerTimeoutError`. The first failing rank is reported
    without waiting for the others, unless a node hosting ranks of the group is lost: then
    :class:`WorkerNodeLostError` names that node, whichever rank failed first.

    ``rank_nodes`` maps each rank to the Ray node id its process reports (where it was placed).
    """

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: ClassWithInitArgs | ColocatedClassWithInitArgs,
        name_prefix: str | None = None,
        timeout_s: float = 3600.0,
        init_timeout_s: float = 600.0,
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError("RayWorkerGroup needs Ray: call verl.single_controller.ray.init_ray() first")
        self._role_classes = role_classes_of(ray_cls_with_init)
        self._world_size = resource_pool.world_size
        self.resource_pool = resource_pool
        self.name_prefix = name_prefix or uuid.uuid4().hex[:8]
        self.timeout_s = timeout_s
        self.rank_nodes: dict[int, str] = {}
        self._actors = self._start_actors(resource_pool.rank_slots(init_timeout_s))
        try:
            self._init_workers(init_timeout_s)
        except BaseException:
            self.shutdown()  # free the bundles of a group that never started
            raise
        self._bind_all_roles()

    def _actor_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        for spec in self._role_classes.values():
            options.update(getattr(spec, "actor_options", {}))
        return options

    def _start_actors(self, slots: list[RankSlot]) -> list[ray.actor.ActorHandle]:
        actor_cls = ray.remote(WorkerHost)
        resources = self.resource_pool.actor_resources()
        actors = []
        for slot in slots:
            strategy = PlacementGroupSchedulingStrategy(slot.placement_group, placement_group_bundle_index=slot.bundle_index)
            options = {**resources, "scheduling_strategy": strategy, "name": f"{self.name_prefix}_rank{slot.rank}", **self._actor_options()}
            actors.append(actor_cls.options(**options).remote(self._role_classes))
        self._slots = slots
        return actors

    def _init_workers(self, timeout_s: float) -> None:
        master_addr, master_port = self._wait({0: self._actors[0].node_address.remote()}, "WorkerHost.node_address",
                                              timeout_s)[0]
        self.rank_nodes = self._wait({rank: actor.node_id.remote() for rank, actor in enumerate(self._actors)},
                                     "WorkerHost.node_id", timeout_s)
        refs = {}
        for slot, actor in zip(self._slots, self._actors):
            env = {
                "RANK": str(slot.rank),
                "WORLD_SIZE": str(self._world_size),
                "LOCAL_RANK": str(slot.local_rank),
                "LOCAL_WORLD_SIZE": str(slot.local_world_size),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
            }
            refs[slot.rank] = actor.init_workers.remote(env)
        names = "+".join(spec.cls.__name__ for spec in self._role_classes.values())
        self.pids = self._wait(refs, f"{names}.__init__", timeout_s)

    def _submit(self, role: str, method: str, plan: CallPlan) -> Callable[[], dict[int, Any]]:
        refs = {rank: self._actors[rank].call.remote(role, method, args, kwargs) for rank, (args, kwargs) in plan.calls.items()}
        return lambda: self._wait(refs, self._qualified(role, method), self.timeout_s)

    def _wait(self, refs: dict[int, ray.ObjectRef], method: str, timeout_s: float) -> dict[int, Any]:
        """Gathers ``{rank: result}``, raising on the first failed rank instead of waiting for all."""
        deadline = time.monotonic() + timeout_s
        pending = {ref: rank for rank, ref in refs.items()}
        results = {}
        try:
            while pending:
                remaining = deadline - time.monotonic()
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(remaining, 0))
                if not ready:
                    raise WorkerTimeoutError(sorted(pending.values()), method, timeout_s)
                for ref in ready:
                    rank = pending.pop(ref)
                    results[rank] = _get_one(ref, rank, method)
        except WorkerOutOfMemoryError:
            raise
        except WorkerError as error:
            # a lost node makes its peers' collectives fail first: name the node, not a peer's error
            lost = self._node_lost(method)
            if lost is not None:
                raise lost from error
            raise
        return results

    def _node_lost(self, method: str) -> WorkerNodeLostError | None:
        """The error naming a node of this group that left the cluster, or None when all are there."""
        from verl.single_controller.ray.nodes import lost_nodes

        lost = lost_nodes(list(self.rank_nodes.values())) if self.rank_nodes else []
        if not lost:
            return None
        ranks = [rank for rank, node_id in sorted(self.rank_nodes.items()) if node_id == lost[0].node_id]
        return WorkerNodeLostError(ranks, method, lost[0].describe())

    def shutdown(self, release_resources: bool = False) -> None:
        """Kills the rank actors (shared with any spawned views) and waits until their processes on
        the controller's node are gone; optionally frees the placement groups.

        ``ray.kill`` only asks Ray to end an actor: a rank holding gigabytes could outlive the
        trainer by many seconds and keep that memory from the next run.
        """
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []
        # only this node's processes can be watched (and a remote rank's pid may name a local process)
        here = ray.get_runtime_context().get_node_id()
        _wait_until_gone([pid for rank, pid in getattr(self, "pids", {}).items() if self.rank_nodes.get(rank, here) == here])
        if release_resources:
            self.resource_pool.release()


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def _is_rank_process(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) Ray worker process on this node (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read()
    except (OSError, IndexError):
        return False
    return state != b"Z" and command.startswith(b"ray::")


def _wait_until_gone(pids: list[int], grace_s: float = 30.0) -> None:
    """Wait for killed rank processes of this node to exit; SIGKILL those still there after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    alive = [pid for pid in pids if _is_rank_process(pid)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _is_rank_process(pid)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _get_one(ref: ray.ObjectRef, rank: int, method: str) -> Any:
    try:
        return ray.get(ref, timeout=0)
    except RayTaskError as error:  # the method raised; WorkerHost.call attached its traceback
        detail = getattr(error.cause, "remote_traceback", None) or _ANSI_ESCAPE.sub("", str(error))
        raise WorkerError(rank, method, detail) from None
    except OutOfMemoryError as error:  # Ray's memory monitor killed the process (this call's and later ones)
        raise WorkerOutOfMemoryError(rank, method, str(error)) from None
    except RayActorError as error:  # the process is gone
        raise WorkerDiedError(rank, method, f"worker process died: {error}") from None
    except GetTimeoutError:  # ray.wait said ready; treat a race as a hang
        raise WorkerTimeoutError([rank], method, 0) from None
