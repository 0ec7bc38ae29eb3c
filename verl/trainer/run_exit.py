"""How a run that cannot finish ends: one line on stderr and a non-zero exit status, no traceback.

:func:`run_or_exit` runs an entry point's work under :func:`verl.utils.signals.stop_on_signals`;
the work's own ``finally`` blocks shut its workers and Ray down, then

* a SIGINT/SIGTERM (:class:`~verl.utils.signals.RunStopped`) ends the process with
  ``stopped by SIGINT: ...`` and status 128 + the signal (130, 143), as a shell reports it;
* Ray's memory monitor killing a worker (:class:`~verl.single_controller.WorkerOutOfMemoryError`)
  ends it with ``error: out of memory: ...`` (what ran out, how much, what to change) and status 1;
* a node hosting ranks leaving the cluster (:class:`~verl.single_controller.WorkerNodeLostError`)
  ends it with ``error: lost Ray node <id> (<ip>) ...`` and status 1; ``stopped`` adds where the
  latest checkpoint is, which the same command resumes from once the cluster has its nodes again;
* a training-health alarm under ``trainer.health.stop_on_alarm``
  (:class:`HealthAlarmStop`) ends it with ``error: training stopped at step
  <n> by a health alarm ...`` (what drifted, from what start) and status 1, ``stopped`` adding where
  the latest checkpoint (from before the alarm) is.

Ray is shut down here too, for work that stopped before it held its worker groups.
"""

from __future__ import annotations

import signal
import sys
from typing import Callable, TypeVar

from verl.utils.signals import Received, RunStopped, stop_on_signals

T = TypeVar("T")

EXIT_OUT_OF_MEMORY = 1
EXIT_NODE_LOST = 1
EXIT_HEALTH_ALARM = 1


class HealthAlarmStop(RuntimeError):
    """A run ended by a training-health alarm under ``trainer.health.stop_on_alarm``
    (:meth:`verl.trainer.ppo.health.HealthMonitor.check_stop`); the message names the step and the
    alarm(s) raised there."""


# What makes a run smaller in host memory, in the order worth trying (docs/configuration.md).
MEMORY_KEYS = ("data.train_batch_size", "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.kv_cache_space_gib",
               "data.max_response_length")


def run_or_exit(work: Callable[[], T], stopped: Callable[[], str] = lambda: "") -> T:
    """``work()``, or the process's end in one line when a signal or the memory monitor stops it.

    Args:
        work: the run (it cleans up after itself in ``finally`` blocks).
        stopped: called after a stop for the rest of the line (e.g. where the latest checkpoint is).
    Returns:
        what ``work`` returned.
    Raises:
        SystemExit: 128 + signal after SIGINT/SIGTERM, :data:`EXIT_OUT_OF_MEMORY` after an
            out-of-memory kill, :data:`EXIT_NODE_LOST` after a node was lost,
            :data:`EXIT_HEALTH_ALARM` after a health alarm stopped training.
    """
    received = Received()
    try:
        with stop_on_signals() as received:
            return work()
    except KeyboardInterrupt as interrupt:  # RunStopped, or what a library made of it (Ray's waits)
        stop = interrupt if isinstance(interrupt, RunStopped) else RunStopped(received.signum or signal.SIGINT)
        _shutdown_ray()
        print(f"stopped by {stop.name}{stopped()}", file=sys.stderr, flush=True)
        sys.exit(stop.exit_code)
    except HealthAlarmStop as alarm:
        _shutdown_ray()
        print(f"error: {alarm}{stopped()}", file=sys.stderr, flush=True)
        sys.exit(EXIT_HEALTH_ALARM)
    except Exception as error:
        # imported here: the single controller brings Ray, which a run that never starts workers
        # (a config error, the train scripts' wrapper) should not pay for
        from verl.single_controller.base.worker_group import WorkerNodeLostError, WorkerOutOfMemoryError

        if isinstance(error, WorkerNodeLostError):
            _shutdown_ray()
            print(f"error: {node_lost_line(error)}{stopped()}", file=sys.stderr, flush=True)
            sys.exit(EXIT_NODE_LOST)
        if not isinstance(error, WorkerOutOfMemoryError):
            raise
        _shutdown_ray()
        print(f"error: {out_of_memory_line(error)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_OUT_OF_MEMORY)


def out_of_memory_line(error) -> str:
    """One line for a :class:`~verl.single_controller.WorkerOutOfMemoryError`: which worker Ray
    stopped in which call, the memory figures, the largest other process, and what to do."""
    facts = error.facts()
    worker = f" (it held {facts['worker_used']})" if "worker_used" in facts else ""
    node = ""
    if "node_used" in facts:
        node = f"; this machine had {facts['node_used']} of {facts['node_total']} in use"
        if "threshold" in facts:
            node += f", above Ray's limit of {facts['threshold']}%"
    other = f"; the largest other process: {facts['largest_other']}" if "largest_other" in facts else ""
    return (f"out of memory: Ray's memory monitor killed worker rank {error.rank} during {error.method}{worker}"
            f"{node}{other}. Memory is shared by every run on this machine: run one at a time (README, sharing "
            f"the machine), or make this run smaller ({', '.join(MEMORY_KEYS)})")


def node_lost_line(error) -> str:
    """One line for a :class:`~verl.single_controller.WorkerNodeLostError`: which node, which ranks,
    during which call."""
    ranks = ", ".join(map(str, error.ranks))
    return (f"lost Ray node {error.node}, which ran worker rank(s) {ranks}, during {error.method}: its raylet "
            f"stopped answering (the machine, its network or Ray's processes on it went down)")


def _shutdown_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
