"""How a worker-group call is spread over ranks and how the per-rank results are gathered.

A worker method is declared with ``@register(dispatch_mode=...)``. When the controller calls
``worker_group.method(*args)``, the mode decides which ranks run it with which arguments
(:func:`plan_calls`) and how their results come back as one value (:func:`collect_results`):

========================  ===================================================  ==========================
mode                      arguments                                            result
========================  ===================================================  ==========================
``ONE_TO_ALL``            the same ``args`` on every rank                      list of rank results, or
                                                                               rank 0's if all are
                                                                               DataProto (identical
                                                                               replicas)
``ALL_TO_ALL``            each argument is a list of ``world_size`` items;     list of rank results
                          rank r gets item r
``DP_COMPUTE_PROTO``      DataProto arguments padded to a multiple of          one DataProto, rows in
                          ``world_size`` and chunked (rank r gets chunk r);    input order, padding
                          other arguments go to every rank                     removed
``RANK_ZERO``             only rank 0 runs (the method must not use            rank 0's result
                          collectives)
========================  ===================================================  ==========================

This mirrors veRL's ``verl.single_controller.base.decorator`` for the modes the trainer uses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto

DISPATCH_ATTR = "__worker_dispatch__"


class Dispatch(enum.Enum):
    """Dispatch modes of a registered worker method (see the module docstring)."""

    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    DP_COMPUTE_PROTO = "dp_compute_proto"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class MethodSpec:
    """What ``@register`` records on a worker method."""

    dispatch_mode: Dispatch
    blocking: bool = True


def register(dispatch_mode: Dispatch = Dispatch.ONE_TO_ALL, blocking: bool = True) -> Callable:
    """Marks a worker method as callable through a worker group.

    Args:
        dispatch_mode: how arguments are spread and results gathered (:class:`Dispatch`).
        blocking: ``True`` waits for every rank and returns the collected result; ``False``
            returns a pending call whose ``.get()`` does that later.

    Raises:
        ValueError: ``dispatch_mode`` is not a :class:`Dispatch`.
    """
    if not isinstance(dispatch_mode, Dispatch):
        raise ValueError(f"dispatch_mode must be a Dispatch member, got {dispatch_mode!r}")

    def decorate(func: Callable) -> Callable:
        setattr(func, DISPATCH_ATTR, MethodSpec(dispatch_mode, blocking))
        return func

    return decorate


def get_method_spec(func: Any) -> MethodSpec | None:
    """The :class:`MethodSpec` of a registered method, ``None`` for others."""
    return getattr(func, DISPATCH_ATTR, None)


@dataclass
class CallPlan:
    """Per-rank arguments of one group call plus what collecting needs to undo padding."""

    calls: dict[int, tuple[tuple, dict]]
    pad_size: int = 0
    padded_rows: int = 0
    extra: dict = field(default_factory=dict)


def plan_calls(mode: Dispatch, world_size: int, method: str, args: tuple, kwargs: dict) -> CallPlan:
    """Decides which ranks run ``method`` with which arguments (see the module docstring).

    Raises:
        ValueError: ``ALL_TO_ALL`` arguments are not lists of ``world_size`` items, or a
            ``DP_COMPUTE_PROTO`` call has no DataProto argument or DataProtos of different lengths.
    """
    if mode is Dispatch.ONE_TO_ALL:
        return CallPlan({rank: (args, kwargs) for rank in range(world_size)})
    if mode is Dispatch.RANK_ZERO:
        return CallPlan({0: (args, kwargs)})
    if mode is Dispatch.ALL_TO_ALL:
        return _plan_all_to_all(world_size, method, args, kwargs)
    if mode is Dispatch.DP_COMPUTE_PROTO:
        return _plan_dp_compute_proto(world_size, method, args, kwargs)
    raise ValueError(f"unknown dispatch mode {mode!r} for {method}")


def _plan_all_to_all(world_size: int, method: str, args: tuple, kwargs: dict) -> CallPlan:
    values = list(args) + list(kwargs.values())
    for value in values:
        if not isinstance(value, (list, tuple)) or len(value) != world_size:
            raise ValueError(
                f"{method} is ALL_TO_ALL: every argument must be a list of world_size={world_size} items, got {type(value).__name__}"
                + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else "")
            )
    calls = {
        rank: (tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()}) for rank in range(world_size)
    }
    return CallPlan(calls)


def _plan_dp_compute_proto(world_size: int, method: str, args: tuple, kwargs: dict) -> CallPlan:
    protos = [v for v in list(args) + list(kwargs.values()) if isinstance(v, DataProto)]
    if not protos:
        raise ValueError(f"{method} is DP_COMPUTE_PROTO but got no DataProto argument")
    lengths = {len(p) for p in protos}
    if len(lengths) > 1:
        raise ValueError(f"{method}: DataProto arguments have different lengths {sorted(lengths)}")

    pad_size = 0

    def split(value: Any) -> list:
        nonlocal pad_size
        if not isinstance(value, DataProto):
            return [value] * world_size
        padded, pad_size = pad_dataproto_to_divisor(value, world_size)
        return padded.chunk(world_size)

    split_args = [split(a) for a in args]
    split_kwargs = {k: split(v) for k, v in kwargs.items()}
    calls = {
        rank: (tuple(a[rank] for a in split_args), {k: v[rank] for k, v in split_kwargs.items()})
        for rank in range(world_size)
    }
    return CallPlan(calls, pad_size=pad_size, padded_rows=lengths.pop() + pad_size)


def collect_results(mode: Dispatch, plan: CallPlan, results: dict[int, Any], method: str) -> Any:
    """Turns the per-rank results (keyed by rank) into the value the controller sees."""
    ordered = [results[rank] for rank in sorted(results)]
    if mode is Dispatch.RANK_ZERO:
        return ordered[0]
    if mode is Dispatch.ONE_TO_ALL:
        if ordered and all(isinstance(r, DataProto) for r in ordered):
            return ordered[0]
        return ordered
    if mode is Dispatch.ALL_TO_ALL:
        return ordered
    return _collect_dp_compute_proto(plan, ordered, method)


def _collect_dp_compute_proto(plan: CallPlan, ordered: list, method: str) -> Any:
    if all(r is None for r in ordered):
        return None
    if not all(isinstance(r, DataProto) for r in ordered):
        return ordered
    output = DataProto.concat(ordered)
    if plan.pad_size == 0 or len(output) == 0:
        return output
    # A method may return k rows per input row (e.g. n samples per prompt); the padded rows'
    # outputs then sit at the end of the last chunk, k per padded row.
    if len(output) % plan.padded_rows != 0:
        raise ValueError(
            f"{method} returned {len(output)} rows for {plan.padded_rows} padded input rows; "
            "cannot remove the padding (output rows must be a multiple of input rows)"
        )
    return unpad_dataproto(output, plan.pad_size * (len(output) // plan.padded_rows))
