"""Start the worker groups the trainer drives: actor+rollout(+reference) and, for PPO, the critic.

By default all roles are colocated: each rank's process hosts the actor/rollout worker (with the
reference model when a KL term needs it) and the critic, so they share devices as in veRL's hybrid
engine. With ``actor_rollout_ref.hybrid_engine=false`` (split pools) the engines run on ranks of their
own (``rollout.nnodes x rollout.n_gpus_per_node``) and get the actor's weights by broadcast.
``trainer.backend=ray`` spreads ranks over Ray actors (``nnodes x n_gpus_per_node``, placed as
:mod:`verl.trainer.ppo.placement` plans, on the cluster the user started when one runs);
``trainer.backend=local`` runs one rank inside the controller (debugging, small CPU runs).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from verl.trainer.ppo.config import PPOConfig
from verl.trainer.ppo.ray_trainer import WorkerHandles
from verl.trainer.ppo.run_plan import RunPlan


def _role_specs(cfg: PPOConfig, plan: RunPlan, rollout_only: bool = False) -> dict[str, Any]:
    """The roles of the training ranks' processes (evaluation: the engine alone)."""
    from verl.single_controller.base.host import ClassWithInitArgs
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    run = plan.worker_run(cfg)
    if rollout_only:  # evaluation: the engine alone (no FSDP actor, optimizer, reference or critic)
        return {"actor_rollout": ClassWithInitArgs(ActorRolloutRefWorker, config=cfg.actor_rollout_ref,
                                                   role="rollout", run=run)}
    split = not cfg.actor_rollout_ref.hybrid_engine
    actor_role = ("actor_ref" if split else "actor_rollout_ref") if plan.needs_reference else \
        ("actor" if split else "actor_rollout")
    actor = ClassWithInitArgs(ActorRolloutRefWorker, config=cfg.actor_rollout_ref, role=actor_role, run=run)
    roles = {"actor_rollout": actor if split else _beside_training(cfg, actor)}
    if plan.needs_critic:
        roles["critic"] = ClassWithInitArgs(CriticWorker, config=cfg.critic, run=run)
    return roles


def _rollout_roles(cfg: PPOConfig, plan: RunPlan) -> dict[str, Any]:
    """The role of split pools' engine ranks (``actor_rollout_ref.hybrid_engine=false``)."""
    from verl.single_controller.base.host import ClassWithInitArgs
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    return {"rollout": _beside_training(cfg, ClassWithInitArgs(
        ActorRolloutRefWorker, config=cfg.actor_rollout_ref, role="rollout", run=plan.worker_run(cfg)))}


def _beside_training(cfg: PPOConfig, spec):
    """With ``rollout.staleness=1`` on Ray, a process that serves rollouts takes two calls at once: the
    next step's rollout beside this step's training calls (or the weight push that waits for it)."""
    if not (cfg.actor_rollout_ref.rollout.staleness and cfg.trainer.backend == "ray"):
        return spec
    from verl.single_controller.ray import RayClassWithInitArgs

    spec = RayClassWithInitArgs(spec.cls, *spec.args, **spec.kwargs)
    spec.update_options({"max_concurrency": 2})
    return spec


def _start_groups(cfg: PPOConfig, plan: RunPlan, bundles: list) -> list:
    """One worker group per bundle: the training ranks' first, then (split pools) the engines' on
    their own pool."""
    if cfg.trainer.backend == "local":
        from verl.single_controller.local import LocalWorkerGroup

        if plan.data_parallel_size != 1:
            raise ValueError(f"trainer.backend=local runs one rank; set trainer.nnodes=1 and "
                             f"trainer.n_gpus_per_node=1 (got {plan.data_parallel_size} ranks)")
        return [LocalWorkerGroup(bundles[0])]
    import ray

    from verl.single_controller.ray import RayWorkerGroup
    from verl.single_controller.ray.init import init_ray
    from verl.trainer.ppo.placement import check_placement, describe_ranks, plan_placement

    init_ray(env_vars=worker_env_vars(cfg, use_gpu=use_gpu()))
    pools = plan_placement(cfg, plan, use_gpu=use_gpu())[:len(bundles)]
    groups = []
    try:
        check_placement(pools)  # a cluster that can never hold the run: nothing of it is left in Ray
        for placement, bundle in zip(pools, bundles):
            groups.append(RayWorkerGroup(placement.resource_pool(), bundle))
            print(describe_ranks(groups[-1].rank_nodes, placement), flush=True)
    except BaseException:
        for group in groups:
            group.shutdown()
        ray.shutdown()
        raise
    return groups


def worker_env_vars(cfg: PPOConfig, use_gpu: bool) -> dict[str, str]:
    """Environment of the Ray worker processes from ``trainer.worker_env_vars``.

    ``null`` (the default): on a CPU-only machine, the glibc malloc settings of
    :data:`verl.single_controller.ray.init.CPU_MALLOC_ENV_VARS` (glibc reads them when the process
    starts, hence here and not in the worker); with GPUs, torch's expandable segments
    (:data:`~verl.single_controller.ray.init.GPU_ALLOCATOR_ENV_VARS`) unless the launching shell sets
    ``PYTORCH_CUDA_ALLOC_CONF`` itself (the workers inherit the user's choice). A mapping replaces
    that choice (``{}``: none).
    """
    from verl.single_controller.ray.init import CPU_MALLOC_ENV_VARS, GPU_ALLOCATOR_ENV_VARS

    configured = cfg.trainer.worker_env_vars
    if configured is None:
        if not use_gpu:
            return dict(CPU_MALLOC_ENV_VARS)
        return {} if "PYTORCH_CUDA_ALLOC_CONF" in os.environ else dict(GPU_ALLOCATOR_ENV_VARS)
    return {str(k): str(v) for k, v in configured.items()}


def use_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def build_worker_groups(cfg: PPOConfig, plan: RunPlan, rollout_only: bool = False) -> WorkerHandles:
    """Start and initialise the worker groups (critic first, so the actor's engine gets what is left).

    ``rollout_only`` (evaluation) starts only the rollout engines, one per rank, as ``actor_rollout``.
    With ``actor_rollout_ref.hybrid_engine=false`` the engines start on their own pool and join the
    actor's rank 0 in a weight-sync group; ``WorkerHandles.sync_weights`` then pushes the actor's
    weights to them (once here, so that they serve exactly the actor's weights from the start).
    """
    from verl.single_controller.base.host import create_colocated_worker_cls

    roles = _role_specs(cfg, plan, rollout_only)
    split = not (rollout_only or cfg.actor_rollout_ref.hybrid_engine)
    bundles = [create_colocated_worker_cls(roles)] + ([create_colocated_worker_cls(_rollout_roles(cfg, plan))]
                                                      if split else [])
    started = _start_groups(cfg, plan, bundles)

    def shutdown() -> None:
        for group in started:
            if hasattr(group, "shutdown"):
                group.shutdown()
        if cfg.trainer.backend == "ray":
            import ray

            ray.shutdown()

    groups = started[0].spawn(prefix_set=list(roles))
    critic, actor_rollout = groups.get("critic"), groups["actor_rollout"]
    rollout, sync_weights = None, WorkerHandles.sync_weights
    try:
        if critic is not None:
            critic.init_model()
        actor_rollout.init_model()
        if split:
            rollout = started[1].spawn(prefix_set=["rollout"])["rollout"]
            rollout.init_model()
            sync_weights = connect_split_pools(actor_rollout, rollout)
            sync_weights(after_update=False)
    except BaseException:  # a failed or interrupted start leaves no worker process behind
        shutdown()
        raise
    ref = actor_rollout if plan.needs_reference and not rollout_only else None
    return WorkerHandles(actor_rollout=actor_rollout, ref=ref, critic=critic, shutdown=shutdown, rollout=rollout,
                         sync_weights=sync_weights)


def connect_split_pools(actor, rollout) -> Callable[..., dict[str, float]]:
    """Form the weight-sync group of the actor's rank 0 and every engine rank
    (:class:`~verl.workers.weight_sync.WeightBroadcast`); returns the push: the engines take the
    actor's current weights (``after_update``: counted as an update in the rollouts' ``updates_pushed``;
    call it while no rollout runs, ``RayPPOTrainer.push_weights``). The push returns the engines'
    slowest ``timing_s/weight_sync`` and ``weight_sync/bytes``."""
    from verl.single_controller.base.worker_group import wait_together

    host, port = actor.weight_sync_address()
    world_size = 1 + rollout.world_size
    wait_together(rollout.join_weight_sync(host, port, world_size), actor.join_weight_sync(host, port, world_size))

    def sync_weights(after_update: bool = True) -> dict[str, float]:
        received, sent = wait_together(rollout.receive_weights(after_update), actor.send_weights())
        metrics = {key: max(rank[key] for rank in received) for key in received[0]}
        return {**metrics, **sent[0]}

    return sync_weights
