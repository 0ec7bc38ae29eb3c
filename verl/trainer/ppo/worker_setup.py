"""Start the worker groups the trainer drives: actor+rollout(+reference) and, for PPO, the critic.

All roles are colocated: each rank's process hosts the actor/rollout worker (with the reference
model when a KL term needs it) and the critic, so they share devices as in veRL's hybrid engine.
``trainer.backend=ray`` spreads ranks over Ray actors (``nnodes x n_gpus_per_node``, placed as
:mod:`verl.trainer.ppo.placement` plans, on the cluster the user started when one runs);
``trainer.backend=local`` runs one rank inside the controller (debugging, small CPU runs).
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.config import PPOConfig
from verl.trainer.ppo.ray_trainer import WorkerHandles
from verl.trainer.ppo.run_plan import RunPlan


def _role_specs(cfg: PPOConfig, plan: RunPlan, rollout_only: bool = False) -> dict[str, Any]:
    from verl.single_controller.base.host import ClassWithInitArgs
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    run = plan.worker_run(cfg)
    if rollout_only:  # evaluation: the engine alone (no FSDP actor, optimizer, reference or critic)
        return {"actor_rollout": ClassWithInitArgs(ActorRolloutRefWorker, config=cfg.actor_rollout_ref,
                                                   role="rollout", run=run)}
    actor_role = "actor_rollout_ref" if plan.needs_reference else "actor_rollout"
    actor = ClassWithInitArgs(ActorRolloutRefWorker, config=cfg.actor_rollout_ref, role=actor_role, run=run)
    if cfg.actor_rollout_ref.rollout.staleness and cfg.trainer.backend == "ray":
        from verl.single_controller.ray import RayClassWithInitArgs

        # two calls at once in each rank's process: the next step's rollout beside this step's training
        actor = RayClassWithInitArgs(actor.cls, *actor.args, **actor.kwargs)
        actor.update_options({"max_concurrency": 2})
    roles = {"actor_rollout": actor}
    if plan.needs_critic:
        roles["critic"] = ClassWithInitArgs(CriticWorker, config=cfg.critic, run=run)
    return roles


def _start_group(cfg: PPOConfig, plan: RunPlan, bundle):
    if cfg.trainer.backend == "local":
        from verl.single_controller.local import LocalWorkerGroup

        if plan.data_parallel_size != 1:
            raise ValueError(f"trainer.backend=local runs one rank; set trainer.nnodes=1 and "
                             f"trainer.n_gpus_per_node=1 (got {plan.data_parallel_size} ranks)")
        return LocalWorkerGroup(bundle)
    import ray

    from verl.single_controller.ray import RayWorkerGroup
    from verl.single_controller.ray.init import init_ray
    from verl.trainer.ppo.placement import check_placement, describe_ranks, plan_placement

    init_ray(env_vars=worker_env_vars(cfg, use_gpu=use_gpu()))
    placement = plan_placement(cfg, plan, use_gpu=use_gpu())
    try:
        check_placement(placement)
    except ValueError:  # a cluster that can never hold the run: nothing of it is left in Ray
        ray.shutdown()
        raise
    group = RayWorkerGroup(placement.resource_pool(), bundle)
    print(describe_ranks(group.rank_nodes, placement), flush=True)
    return group


def worker_env_vars(cfg: PPOConfig, use_gpu: bool) -> dict[str, str]:
    """Environment of the Ray worker processes from ``trainer.worker_env_vars``.

    ``null`` (the default): on a CPU-only machine, the glibc malloc settings of
    :data:`verl.single_controller.ray.init.CPU_MALLOC_ENV_VARS` (glibc reads them when the process
    starts, hence here and not in the worker);
    nothing with GPUs. A mapping replaces that choice (``{}``: none).
    """
    from verl.single_controller.ray.init import CPU_MALLOC_ENV_VARS

    configured = cfg.trainer.worker_env_vars
    if configured is None:
        return {} if use_gpu else dict(CPU_MALLOC_ENV_VARS)
    return {str(k): str(v) for k, v in configured.items()}


def use_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def build_worker_groups(cfg: PPOConfig, plan: RunPlan, rollout_only: bool = False) -> WorkerHandles:
    """Start and initialise the worker groups (critic first, so the actor's engine gets what is left).

    ``rollout_only`` (evaluation) starts only the rollout engines, one per rank, as ``actor_rollout``.
    """
    from verl.single_controller.base.host import create_colocated_worker_cls

    roles = _role_specs(cfg, plan, rollout_only)
    group = _start_group(cfg, plan, create_colocated_worker_cls(roles))

    def shutdown() -> None:
        if hasattr(group, "shutdown"):
            group.shutdown()
        if cfg.trainer.backend == "ray":
            import ray

            ray.shutdown()

    groups = group.spawn(prefix_set=list(roles))
    critic, actor_rollout = groups.get("critic"), groups["actor_rollout"]
    try:
        if critic is not None:
            critic.init_model()
        actor_rollout.init_model()
    except BaseException:  # a failed or interrupted start leaves no worker process behind
        shutdown()
        raise
    ref = actor_rollout if plan.needs_reference and not rollout_only else None
    return WorkerHandles(actor_rollout=actor_rollout, ref=ref, critic=critic, shutdown=shutdown)
