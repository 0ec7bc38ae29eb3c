"""Starting Ray for the trainer, or joining the cluster the user started, including on small CPU-only machines."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import ray

from verl.utils.config import ConfigError

DEFAULT_ENV_VARS = {"TOKENIZERS_PARALLELISM": "false", "NCCL_CUMEM_ENABLE": "0"}

# glibc malloc settings for CPU-only runs, where the actor, reference, optimizer and vLLM engine
# all live in one worker's heap (trainer.worker_env_vars: null picks them; see worker_env_vars()).
# MALLOC_ARENA_MAX: at most 2 heaps (glibc's default is 8 per core), so memory freed by one thread
# is reused by the others instead of sitting in a per-thread arena. A process-wide
# MALLOC_MMAP_THRESHOLD_ is not set: its page faults slow every phase (docs/benchmarks.md); the
# worker's optional heap tuning (verl.utils.host_memory, trainer.host_memory) applies a threshold
# to the actor update only and trims the heap after each phase.
CPU_MALLOC_ENV_VARS = {"MALLOC_ARENA_MAX": "2"}

# torch's CUDA caching allocator for GPU runs (trainer.worker_env_vars: null picks it): the packed
# micro-batches change shape every step, and fixed-size segments leave freed blocks that no later
# request fits, so the reserved memory climbs far above the allocated; expandable segments grow and
# shrink one mapping instead. vLLM's sleep-mode pool turns the setting off inside its own allocations,
# and CUDA IPC (the engine-process weight push) shares such memory. Measured in docs/benchmarks.md.
GPU_ALLOCATOR_ENV_VARS = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


class ClusterJoinError(ConfigError):
    """The running Ray cluster could not be joined (unreachable, or its token authentication refused us)."""


def cluster_address(address: str | None = None) -> str | None:
    """The running cluster ``ray.init`` would join, as ``host:port``; None when it would start one.

    ``address`` if given, else ``RAY_ADDRESS`` (which ``ray job submit`` sets for its entry point),
    else the cluster ``ray start`` last started on this machine. Ray's own resolution is asked
    (``canonicalize_bootstrap_address``, private in Ray 2.60, which requirements/ pin) so the trainer
    decides exactly as ``ray.init`` does; a ``"local"`` address means a new local cluster.

    Raises:
        ConnectionError: ``address="auto"`` and no cluster runs.
    """
    from ray._private.services import canonicalize_bootstrap_address

    return canonicalize_bootstrap_address(address)


def _join_failure(address: str, error: ConnectionError) -> str:
    """One line for a cluster that did not let this process join."""
    where = f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}" if os.environ.get("RAY_ADDRESS") else f"the Ray cluster at {address}"
    if "InvalidAuthToken" in f"{error} {error.__cause__}":
        return (f"{where}: the cluster refused this process's token: it uses token authentication; set "
                f"RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<`ray get-auth-token` on the head> (docs/multinode.md)")
    return f"{where}: cannot join the Ray cluster there ({error}); is it running (`ray status` on the head)?"


def init_ray(
    num_cpus: int | None = None,
    env_vars: dict[str, str] | None = None,
    address: str | None = None,
    **ray_init_kwargs: Any,
) -> None:
    """Starts (or joins) Ray once per process; a no-op when Ray is already initialised.

    Args:
        num_cpus: CPUs a new local cluster advertises (default: ``os.cpu_count()``; ignored when
            joining a running cluster, whose nodes advertise their own). Worker actors
            on CPU request fractional CPUs (``RayResourcePool(cpus_per_worker=...)``), so two
            actors and the driver fit on a 2-core machine.
        env_vars: environment of every Ray worker process, on top of :data:`DEFAULT_ENV_VARS`; the
            driver's ``PYTHONPATH`` (plus its working directory) is passed on so workers import the
            same modules.
        address: an existing cluster (``"auto"`` or ``"host:port"``); ``None`` joins the one
            :func:`cluster_address` finds (``RAY_ADDRESS``, or ``ray start`` on this machine) and
            starts a local one when there is none.
        ray_init_kwargs: passed to ``ray.init`` (e.g. ``object_store_memory``, ``namespace``).

    Raises:
        ClusterJoinError: a running cluster was found but could not be joined (one line: where, why,
            what to set).

    The dashboard is off (it costs a process and memory) and worker logs go to the driver. A SIGTERM
    handler the caller installed stays in place.
    """
    if ray.is_initialized():
        return
    pythonpath = os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH", "")] if p)
    runtime_env = dict(ray_init_kwargs.pop("runtime_env", None) or {})
    runtime_env["env_vars"] = {
        **DEFAULT_ENV_VARS,
        "PYTHONPATH": pythonpath,
        **runtime_env.get("env_vars", {}),
        **(env_vars or {}),
    }
    joining = cluster_address(address) is not None
    if not joining and num_cpus is None:
        num_cpus = os.cpu_count() or 1
    main_thread = threading.current_thread() is threading.main_thread()
    sigterm_handler = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        ray.init(
            # joining: the caller's address as given, so Ray resolves it (and its token authentication)
            # as it always does; otherwise "local", so nothing Ray finds later is joined with num_cpus
            address=address if joining else "local",
            num_cpus=None if joining else num_cpus,
            include_dashboard=False,
            log_to_driver=True,
            runtime_env=runtime_env,
            **ray_init_kwargs,
        )
    except ConnectionError as error:
        if not joining:
            raise
        raise ClusterJoinError(_join_failure(cluster_address(address), error)) from None
    if callable(sigterm_handler):
        # ray.init replaces the SIGTERM handler with a bare sys.exit; keep the caller's (the
        # entry points' clean stop, verl.utils.signals.stop_on_signals)
        signal.signal(signal.SIGTERM, sigterm_handler)
