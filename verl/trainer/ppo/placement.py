"""Where a run's ranks go on Ray: the plan, its check against the cluster, and where they went.

``trainer.nnodes x trainer.n_gpus_per_node`` ranks, one placement group per node (its bundles packed
on one node, each group on a node of its own: :class:`~verl.single_controller.ray.RayResourcePool`),
ranks numbered node by node. On CPU-only machines a rank is a CPU process and its bundle holds CPUs
only, so ``n_gpus_per_node`` means ranks per node there.

Before a placement group is asked for, the plan is checked against the nodes of the cluster the run
joined: a run the cluster can never hold (too few nodes, a node too small) stops with one line
naming what it needs and what the cluster has, instead of waiting for resources that will not come.
``trainer.dry_run=true`` stops there: it prints the plan and, when a cluster runs, the check and the
node each placement group lands on (reserved, then released), and starts no worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.trainer.ppo.config import PPOConfig
from verl.trainer.ppo.run_plan import RunPlan
from verl.utils.config import ConfigError

# How long a dry run waits for its placement groups (a cluster busy with another job may not have
# the resources free; the dry run then says so instead of waiting as long as a run would).
DRY_RUN_PLACEMENT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class PlacementPlan:
    """The ranks of a run and what each asks of a node.

    Args:
        nnodes: Ray nodes (``trainer.nnodes``), one placement group each.
        ranks_per_node: ranks on each node (``trainer.n_gpus_per_node``).
        use_gpu: each rank takes a GPU (else it is a CPU process).
        cpus_per_rank: CPUs in each rank's bundle.
        roles: what each rank's process hosts (colocated roles).
        rollout_engine: ``actor_rollout_ref.rollout.name``.
        tensor_parallel: ``actor_rollout_ref.rollout.tensor_model_parallel_size`` (ranks per engine).
        name: the pool's name in the description and its placement groups' names ("" for the training
            ranks; ``rollout`` for split pools' engines).
    """

    nnodes: int
    ranks_per_node: int
    use_gpu: bool
    cpus_per_rank: float
    roles: tuple[str, ...]
    rollout_engine: str
    tensor_parallel: int
    name: str = ""

    @property
    def world_size(self) -> int:
        """All ranks: ``nnodes x ranks_per_node``."""
        return self.nnodes * self.ranks_per_node

    @property
    def bundle(self) -> dict[str, float]:
        """One rank's resources, as :meth:`RayResourcePool.bundle` asks for them."""
        return {"CPU": self.cpus_per_rank, **({"GPU": 1.0} if self.use_gpu else {})}

    def node_bundle(self) -> dict[str, float]:
        """What one node must hold: ``ranks_per_node`` bundles."""
        return {key: value * self.ranks_per_node for key, value in self.bundle.items()}

    def resource_pool(self):
        """The :class:`~verl.single_controller.ray.RayResourcePool` of this plan (no Ray call yet)."""
        from verl.single_controller.ray import RayResourcePool

        return RayResourcePool(process_on_nodes=[self.ranks_per_node] * self.nnodes, use_gpu=self.use_gpu,
                               cpus_per_worker=self.cpus_per_rank, name_prefix=f"{self.name}_" if self.name else "")

    def problems(self) -> list[str]:
        """What makes the plan impossible on any cluster."""
        if "rollout" in self.roles and self.ranks_per_node % self.tensor_parallel:
            return [f"actor_rollout_ref.rollout.tensor_model_parallel_size={self.tensor_parallel} must divide "
                    f"{self.config_key('n_gpus_per_node')}={self.ranks_per_node}: an engine's ranks share one node"]
        return []

    def config_key(self, leaf: str) -> str:
        """The config key that sets ``leaf`` (``nnodes``, ``n_gpus_per_node``) for this pool."""
        return f"{self.name or 'trainer'}.{leaf}"

    def describe(self) -> str:
        """The plan in a few lines (printed by a dry run)."""
        device = "1 GPU + " if self.use_gpu else ""
        nodes = "; ".join(f"node {i}: ranks {_ranks_text(self.node_ranks(i))}" for i in range(min(self.nnodes, 8)))
        more = f"; ... node {self.nnodes - 1}: ranks {_ranks_text(self.node_ranks(self.nnodes - 1))}" \
            if self.nnodes > 8 else ""
        engines = self.world_size // self.tensor_parallel
        colocated = "actor" in self.roles
        where = ("colocated with the actor" if colocated else "on ranks of their own; the actor's rank 0 "
                 "broadcasts its weights to them after each update")
        engines = (f"  rollout: {engines} {self.rollout_engine} engine(s) of {self.tensor_parallel} rank(s), {where}"
                   + (", each inside one node" if self.tensor_parallel > 1 else "")) if "rollout" in self.roles else None
        title = f"{self.name} pool" if self.name else "placement plan"
        lines = [
            f"{title}: {self.world_size} ranks = {self.config_key('nnodes')} {self.nnodes} x {self.config_key('n_gpus_per_node')} "
            f"{self.ranks_per_node}; one placement group per node, each on a Ray node of its own",
            f"  each rank: {device}{self.cpus_per_rank:g} CPU, one process hosting {', '.join(self.roles)}"
            + ("" if self.use_gpu else " (no GPU on this machine: ranks are CPU processes; with GPUs each "
                                       "rank also takes 1 GPU)"),
            f"  each node must hold {_resources_text(self.node_bundle())}",
            f"  {nodes}{more}",
        ] + ([engines] if engines else [])
        return "\n".join(lines + [f"  problem: {problem}" for problem in self.problems()])

    def node_ranks(self, node: int) -> list[int]:
        """The ranks of node ``node`` (numbered node by node)."""
        return list(range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node))


def plan_placement(cfg: PPOConfig, plan: RunPlan, use_gpu: bool) -> list[PlacementPlan]:
    """The pools of ``cfg``'s ranks (``use_gpu``: whether ranks take GPUs): the training ranks, and with
    ``actor_rollout_ref.hybrid_engine=false`` the rollout engines' ranks after them."""
    split = not cfg.actor_rollout_ref.hybrid_engine
    roles = ["actor"] + ([] if split else ["rollout"]) + (["reference"] if plan.needs_reference else []) + \
        (["critic"] if plan.needs_critic else [])
    rollout = cfg.actor_rollout_ref.rollout
    # only vLLM splits an engine over ranks; the transformers engine is one per rank
    tensor_parallel = rollout.tensor_model_parallel_size if rollout.name == "vllm" else 1
    pools = [PlacementPlan(nnodes=cfg.trainer.nnodes, ranks_per_node=cfg.trainer.n_gpus_per_node, use_gpu=use_gpu,
                           cpus_per_rank=1.0, roles=tuple(roles), rollout_engine=rollout.name,
                           tensor_parallel=tensor_parallel)]
    if split:
        pools.append(PlacementPlan(nnodes=cfg.rollout.nnodes, ranks_per_node=cfg.rollout.n_gpus_per_node,
                                   use_gpu=use_gpu, cpus_per_rank=1.0, roles=("rollout",), rollout_engine=rollout.name,
                                   tensor_parallel=tensor_parallel, name="rollout"))
    return pools


def fit_problems(placement: PlacementPlan, nodes) -> list[str]:
    """Why the cluster of ``nodes`` (:class:`~verl.single_controller.ray.nodes.RayNode`) can never hold
    ``placement``, judged on each alive node's total resources; empty when it can."""
    alive = sorted((node for node in nodes if node.alive), key=lambda node: node.node_id)
    need = placement.node_bundle()
    large = [node for node in alive if all(node.resources.get(key, 0.0) >= value for key, value in need.items())]
    if len(large) >= placement.nnodes:
        return []
    have = ", ".join(f"{node.node_id[:12]} ({_resources_text(node.resources)})" for node in alive) or "none"
    return [f"{placement.config_key('nnodes')}={placement.nnodes} x {placement.config_key('n_gpus_per_node')}="
            f"{placement.ranks_per_node} needs "
            f"{placement.nnodes} Ray node(s) holding {_resources_text(need)} each; the cluster has "
            f"{len(alive)} alive node(s), {len(large)} of them large enough: {have}. Add nodes "
            f"(`ray start --address=<head>:<port>` on each; docs/multinode.md) or lower {placement.config_key('nnodes')}"]


def total_problems(pools: list[PlacementPlan], nodes) -> list[str]:
    """Why the alive nodes together can never hold every pool at once (pools that each fit may not)."""
    need: dict[str, float] = {}
    for pool in pools:
        for key, value in pool.node_bundle().items():
            need[key] = need.get(key, 0.0) + value * pool.nnodes
    have = {key: sum(node.resources.get(key, 0.0) for node in nodes if node.alive) for key in need}
    if all(have[key] >= need[key] for key in need):
        return []
    return [f"the pools ({', '.join(pool.name or 'training' for pool in pools)}) need {_resources_text(need)} in "
            f"all; the cluster's alive nodes have {_resources_text(have)}"]


def check_placement(pools: list[PlacementPlan]) -> None:
    """Check the pools against the cluster this process is connected to.

    Raises:
        ConfigError: a pool is impossible, or the cluster can never hold the pools (one line each).
    """
    from verl.single_controller.ray.nodes import cluster_nodes

    nodes = cluster_nodes()
    problems = [p for pool in pools for p in pool.problems() + fit_problems(pool, nodes)]
    problems += total_problems(pools, nodes) if len(pools) > 1 and not problems else []
    if problems:
        raise ConfigError("; ".join(problems))


def describe_ranks(rank_nodes: dict[int, str], placement: PlacementPlan) -> str:
    """Where the ranks went, from the node id each rank's process reported (``RayWorkerGroup.rank_nodes``)."""
    from verl.single_controller.ray.nodes import cluster_nodes

    ips = {node.node_id: node.ip for node in cluster_nodes()}
    title = f"{placement.name} pool placement" if placement.name else "placement"
    lines = [f"{title}: {len(rank_nodes)} rank(s) on {len(set(rank_nodes.values()))} Ray node(s)"]
    for node in range(placement.nnodes):
        ranks = placement.node_ranks(node)
        for node_id in dict.fromkeys(rank_nodes[r] for r in ranks):
            mine = [r for r in ranks if rank_nodes[r] == node_id]
            lines.append(f"  node {node}: ranks {_ranks_text(mine)} on Ray node {node_id} ({ips.get(node_id, '?')})")
    return "\n".join(lines)


def dry_run(cfg: PPOConfig, plan: RunPlan, use_gpu: bool) -> None:
    """Print the placement plan, then, when a Ray cluster runs, join it, check the plan against it and
    reserve the placement groups to print the node each lands on (released at once). Starts no Ray
    cluster and no worker.

    Raises:
        ConfigError: the plan is impossible, or the running cluster can never hold it.
    """
    import ray

    from verl.single_controller.ray.init import cluster_address, init_ray

    pools = plan_placement(cfg, plan, use_gpu)
    print("\n".join(pool.describe() for pool in pools), flush=True)
    problems = [problem for pool in pools for problem in pool.problems()]
    if problems:
        raise ConfigError("; ".join(problems))
    address = cluster_address()
    if address is None:
        print("cluster: none running (RAY_ADDRESS unset, no `ray start` on this machine); a run would start "
              "a local one-node Ray", flush=True)
        return
    init_ray()
    try:
        check_placement(pools)
        print(f"cluster {address}: {_reserve(pools)}", flush=True)
    finally:
        ray.shutdown()


def _reserve(placements: list[PlacementPlan]) -> str:
    """Reserve the pools' placement groups together, then release them; where they landed, or why
    they did not."""
    pools = [placement.resource_pool() for placement in placements]
    try:
        for pool in pools:
            pool.placement_groups(DRY_RUN_PLACEMENT_TIMEOUT_S)
        return "fits; placement groups reserved and released: " + "; ".join(
            f"{placement.name + ' ' if placement.name else ''}node {index} -> Ray node {node_id}"
            for placement, pool in zip(placements, pools) for index, node_id in enumerate(pool.node_ids()))
    except TimeoutError as error:  # the nodes are large enough, but busy now
        return f"the plan fits its nodes, but {error}"
    finally:
        for pool in pools:
            pool.release()


def _ranks_text(ranks: list[int]) -> str:
    """``0-7`` for a contiguous run, ``0, 2`` otherwise."""
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def _resources_text(resources: dict[str, float]) -> str:
    """``8 GPU, 8 CPU``: the device resources only (Ray's memory and node markers left out)."""
    return ", ".join(f"{resources[key]:g} {key}" for key in ("GPU", "CPU") if key in resources) or "no CPU or GPU"
