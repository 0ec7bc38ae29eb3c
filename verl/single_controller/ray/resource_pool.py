"""Resource pools: where the ranks of a worker group run (Ray placement groups)."""

from __future__ import annotations

from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group


@dataclass(frozen=True)
class RankSlot:
    """Where one rank runs: a bundle of a node's placement group."""

    rank: int
    node_index: int
    local_rank: int
    local_world_size: int
    placement_group: PlacementGroup
    bundle_index: int


class RayResourcePool:
    """``process_on_nodes[i]`` worker processes on node i (one GPU each when ``use_gpu``).

    One placement group per node, its bundles packed on one node (``STRICT_PACK``), as veRL does.
    Ranks are numbered node by node. ``max_colocate_count`` worker groups (separate actors) may
    share a bundle: each actor then takes ``1 / max_colocate_count`` GPU. Roles colocated in one
    process (:func:`create_colocated_worker_cls`) need only 1.

    Args:
        process_on_nodes: worker processes per node, e.g. ``[8, 8]`` for two 8-GPU nodes.
        use_gpu: give each process a GPU; otherwise CPU only.
        max_colocate_count: separate worker groups allowed per bundle.
        cpus_per_worker: CPUs each actor requests; fractional values (e.g. 0.1) let several
            actors share a small CPU machine.

    Raises:
        ValueError: an empty or non-positive ``process_on_nodes``.
    """

    def __init__(
        self,
        process_on_nodes: list[int] | None = None,
        use_gpu: bool = True,
        max_colocate_count: int = 1,
        cpus_per_worker: float = 1.0,
        name_prefix: str = "",
    ) -> None:
        process_on_nodes = list(process_on_nodes or [1])
        if not process_on_nodes or any(n < 1 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must list positive counts, got {process_on_nodes}")
        if max_colocate_count < 1 or cpus_per_worker <= 0:
            raise ValueError(f"max_colocate_count={max_colocate_count} and cpus_per_worker={cpus_per_worker} must be positive")
        self.process_on_nodes = process_on_nodes
        self.use_gpu = use_gpu
        self.max_colocate_count = max_colocate_count
        self.cpus_per_worker = cpus_per_worker
        self.name_prefix = name_prefix
        self._placement_groups: list[PlacementGroup] | None = None

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def actor_resources(self) -> dict[str, float]:
        """``num_cpus``/``num_gpus`` for one actor of one worker group."""
        return {"num_cpus": self.cpus_per_worker, "num_gpus": (1.0 / self.max_colocate_count) if self.use_gpu else 0}

    def _bundle(self) -> dict[str, float]:
        bundle = {"CPU": self.cpus_per_worker * self.max_colocate_count}
        if self.use_gpu:
            bundle["GPU"] = 1
        return bundle

    def placement_groups(self, timeout_s: float = 300.0) -> list[PlacementGroup]:
        """Creates (once) and waits for the per-node placement groups.

        Raises:
            TimeoutError: the cluster cannot provide the bundles within ``timeout_s`` (the message
                gives what was asked and what Ray has available).
        """
        if self._placement_groups is None:
            groups = [
                placement_group([self._bundle()] * count, strategy="STRICT_PACK", name=f"{self.name_prefix}pg_node{i}" if self.name_prefix else "")
                for i, count in enumerate(self.process_on_nodes)
            ]
            ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=timeout_s)
            if len(ready) < len(groups):
                for group in groups:
                    remove_placement_group(group)
                raise TimeoutError(
                    f"placement groups for process_on_nodes={self.process_on_nodes} with bundle {self._bundle()} "
                    f"not ready after {timeout_s:.0f} s; Ray has {ray.available_resources()}"
                )
            self._placement_groups = groups
        return self._placement_groups

    def rank_slots(self, timeout_s: float = 300.0) -> list[RankSlot]:
        """One :class:`RankSlot` per rank, in rank order."""
        slots, rank = [], 0
        for node_index, (group, count) in enumerate(zip(self.placement_groups(timeout_s), self.process_on_nodes)):
            for local_rank in range(count):
                slots.append(RankSlot(rank, node_index, local_rank, count, group, local_rank))
                rank += 1
        return slots

    def release(self) -> None:
        """Removes the placement groups (after the worker groups using them are shut down)."""
        for group in self._placement_groups or []:
            remove_placement_group(group)
        self._placement_groups = None
