"""Backend-independent worker group: binds registered worker methods as group methods.

``group.compute_log_prob(data)`` plans the per-rank calls from the method's dispatch mode, asks
the backend (Ray actors or the in-process host) to run them, waits for every rank within the
group's timeout, and collects the results. Backends implement :meth:`WorkerGroup._submit`.
"""

from __future__ import annotations

import copy
import functools
import inspect
import queue
import re
import threading
from typing import Any, Callable

from verl.single_controller.base.decorator import CallPlan, MethodSpec, collect_results, get_method_spec, plan_calls
from verl.single_controller.base.host import ClassWithInitArgs, ColocatedClassWithInitArgs

DEFAULT_ROLE = "default"


class WorkerError(RuntimeError):
    """A worker method failed on a rank; the message carries the remote traceback."""

    def __init__(self, rank: int, method: str, detail: str) -> None:
        super().__init__(f"worker rank {rank} failed in {method}:\n{detail}")
        self.rank = rank
        self.method = method


class WorkerDiedError(WorkerError):
    """The rank's process exited (killed, ``os._exit``, out of memory) during a call."""


class WorkerOutOfMemoryError(WorkerDiedError):
    """The machine ran low on memory and Ray's memory monitor killed the rank's process.

    ``detail`` is Ray's report (the node's memory use against ``RAY_memory_usage_threshold``, the
    process it killed, the largest processes); :meth:`facts` picks the figures out of it.
    """

    def __init__(self, rank: int, method: str, detail: str) -> None:
        super().__init__(rank, method, detail)
        self.detail = detail

    def facts(self) -> dict[str, str]:
        """The figures of Ray's report, those it has: ``node_used``, ``node_total`` (e.g. ``"22.9GB"``),
        ``threshold`` (percent of the total), ``worker_used`` (the killed process), ``largest_other``
        (the biggest other process: pid, GB, command)."""
        found = {}
        for pattern in (_RAY_NODE_MEMORY, _RAY_THRESHOLD, _RAY_KILLED):
            match = pattern.search(self.detail)
            if match:
                found.update(match.groupdict())
        killed = re.search(r"pid=(\d+)", self.detail[self.detail.find("Selected to kill"):])
        for line in self.detail[self.detail.find("Top 10 memory users"):].splitlines()[1:]:
            fields = line.split("\t")
            if len(fields) == 3 and fields[0].isdigit() and (killed is None or fields[0] != killed.group(1)):
                found["largest_other"] = f"pid {fields[0]} ({fields[2][:60].rstrip('.')}) {fields[1]}GB"
                break
        return found


# Ray 2.60's OutOfMemoryError text: "Memory on the node (IP: ..., ID: ...) was 22.90GB used / 23.54GB
# limit (0.97)", "exceeded threshold of 22363004108B (95.0% of ...B limit)", "Selected to kill: (Actor(...):
# ..., pid=123, actual memory used=4.90GB, ...)", then "Top 10 memory users: PID\tMEM(GB)\tCOMMAND" rows.
_RAY_NODE_MEMORY = re.compile(r"was (?P<node_used>[\d.]+[KMGT]?B) used / (?P<node_total>[\d.]+[KMGT]?B) limit")
_RAY_THRESHOLD = re.compile(r"exceeded threshold of \d+B \((?P<threshold>[\d.]+)% of")
_RAY_KILLED = re.compile(r"actual memory used=(?P<worker_used>[\d.]+[KMGT]?B)")


class WorkerNodeLostError(WorkerDiedError):
    """A node hosting ranks of the group left the cluster (its raylet died or the machine is gone).

    Raised in place of whatever error reached the controller first (a lost peer makes the ranks that
    share a collective with it fail too). ``ranks`` are those the lost node hosted.
    """

    def __init__(self, ranks: list[int], method: str, node: str) -> None:
        super().__init__(ranks[0], method, f"its node {node} left the cluster")
        self.ranks = ranks
        self.node = node


class WorkerTimeoutError(WorkerError, TimeoutError):
    """Ranks gave no result within the group's timeout (a hang, e.g. a collective missing a peer)."""

    def __init__(self, ranks: list[int], method: str, timeout_s: float) -> None:
        RuntimeError.__init__(self, f"worker ranks {ranks} gave no result for {method} within {timeout_s:.0f} s")
        self.rank = ranks[0]
        self.ranks = ranks
        self.method = method


class PendingCall:
    """Result of a non-blocking call; ``get()`` waits for every rank and collects."""

    def __init__(self, wait: Callable[[], dict[int, Any]], finish: Callable[[dict[int, Any]], Any]) -> None:
        self._wait, self._finish = wait, finish

    def get(self) -> Any:
        return self._finish(self._wait())


def wait_together(*calls: PendingCall) -> list[Any]:
    """The results of pending calls that wait on each other (the two sides of a collective across
    worker groups), in order; the first failure is raised as soon as it happens, not after the
    other side's collective timeout."""
    results: list[Any] = [None] * len(calls)
    errors: "queue.Queue[tuple[int, BaseException | None]]" = queue.Queue()

    def run(index: int, call: PendingCall) -> None:
        try:
            results[index] = call.get()
            errors.put((index, None))
        except BaseException as error:  # noqa: BLE001  (handed to the caller's thread)
            errors.put((index, error))

    for index, call in enumerate(calls):  # daemons: a side left blocked never holds up the exit
        threading.Thread(target=run, args=(index, call), daemon=True).start()
    for _ in calls:
        _, error = errors.get()
        if error is not None:
            raise error
    return results


def role_classes_of(cls_with_init: ClassWithInitArgs | ColocatedClassWithInitArgs) -> dict[str, ClassWithInitArgs]:
    """``{role: ClassWithInitArgs}`` of a single class (role ``"default"``) or a colocated bundle."""
    if isinstance(cls_with_init, ColocatedClassWithInitArgs):
        return dict(cls_with_init.roles)
    if isinstance(cls_with_init, ClassWithInitArgs):
        return {DEFAULT_ROLE: cls_with_init}
    raise ValueError(f"expected a ClassWithInitArgs or a colocated bundle, got {type(cls_with_init).__name__}")


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Registered (``@register``) methods of ``cls`` and its bases, by name."""
    found = {}
    for name, member in inspect.getmembers(cls, predicate=callable):
        spec = get_method_spec(member)
        if spec is not None:
            found[name] = spec
    return found


class WorkerGroup:
    """Calls registered worker methods on every rank (see :mod:`.decorator` for the modes).

    Subclasses set ``self._role_classes`` and ``self._world_size``, start the ranks, then call
    :meth:`_bind_all_roles`. A group over colocated roles exposes ``{role}_{method}``; its
    :meth:`spawn` views expose the plain method names of one role.
    """

    _role_classes: dict[str, ClassWithInitArgs]
    _world_size: int
    timeout_s: float

    @property
    def world_size(self) -> int:
        return self._world_size

    def _submit(self, role: str, method: str, plan: CallPlan) -> Callable[[], dict[int, Any]]:
        """Starts the planned calls; returns a function that waits and gives ``{rank: result}``
        or raises :class:`WorkerError` naming the rank."""
        raise NotImplementedError

    def _qualified(self, role: str, method: str) -> str:
        """``WorkerClass.method``, the name errors use."""
        return f"{self._role_classes[role].cls.__name__}.{method}"

    def _bind_all_roles(self) -> None:
        self._bound_names: list[str] = []
        if len(self._role_classes) == 1:
            self._bind_role(next(iter(self._role_classes)), prefix="")
        else:
            for role in self._role_classes:
                self._bind_role(role, prefix=f"{role}_")

    def _bind_role(self, role: str, prefix: str) -> None:
        worker_cls = self._role_classes[role].cls
        for name, spec in registered_methods(worker_cls).items():
            attr = prefix + name
            if hasattr(type(self), attr):
                raise ValueError(f"{worker_cls.__name__}.{name} clashes with the worker group attribute {attr!r}")
            setattr(self, attr, self._make_group_method(role, name, spec, getattr(worker_cls, name)))
            self._bound_names.append(attr)

    def _make_group_method(self, role: str, name: str, spec: MethodSpec, func: Callable) -> Callable:
        qualified = self._qualified(role, name)

        @functools.wraps(func)
        def group_method(*args: Any, **kwargs: Any) -> Any:
            plan = plan_calls(spec.dispatch_mode, self._world_size, qualified, args, kwargs)
            wait = self._submit(role, name, plan)
            pending = PendingCall(wait, lambda results: collect_results(spec.dispatch_mode, plan, results, qualified))
            return pending.get() if spec.blocking else pending

        return group_method

    def spawn(self, prefix_set: set[str] | list[str]) -> dict[str, "WorkerGroup"]:
        """One group per named role, sharing this group's processes (veRL's ``spawn``).

        Raises:
            ValueError: a role is not hosted by this group.
        """
        unknown = sorted(set(prefix_set) - set(self._role_classes))
        if unknown:
            raise ValueError(f"roles {unknown} are not hosted by this group (has {sorted(self._role_classes)})")
        return {role: self._view(role) for role in prefix_set}

    def _view(self, role: str) -> "WorkerGroup":
        view = copy.copy(self)
        for attr in self._bound_names:
            view.__dict__.pop(attr, None)
        view._bound_names = []
        view._bind_role(role, prefix="")
        return view
