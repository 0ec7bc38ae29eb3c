"""Resource pools: where the ranks of a worker group run (Ray placement groups)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

# The label every Ray node carries with its id (Ray >= 2.4x), which bundle label selectors match.
NODE_ID_LABEL = "ray.io/node-id"


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

    One placement group per node, its bundles packed on one node (``STRICT_PACK``), as veRL does,
    and each group on a node of its own: with several nodes the groups are placed one after the
    other, each excluding the nodes taken (a label selector on the node id). Without that, Ray packs
    small groups (CPU ranks) onto one node and ``trainer.nnodes`` would not mean nodes. Ranks are
    numbered node by node. ``max_colocate_count`` worker groups (separate actors) may
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

    def bundle(self) -> dict[str, float]:
        """The resources of one rank's bundle (``{"CPU": c}``, plus ``{"GPU": 1}`` with GPUs)."""
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
            deadline = time.monotonic() + timeout_s
            groups: list[PlacementGroup] = []
            for index, count in enumerate(self.process_on_nodes):
                taken = [placement_group_table(g)["bundles_to_node_id"][0] for g in groups]
                selector = [{NODE_ID_LABEL: f"!in({','.join(taken)})"}] * count if taken else None
                groups.append(placement_group([self.bundle()] * count, strategy="STRICT_PACK",
                                              name=f"{self.name_prefix}pg_node{index}" if self.name_prefix else "",
                                              bundle_label_selector=selector))
                # placed before the next is asked for: the next one's selector needs this one's node
                ready, _ = ray.wait([groups[-1].ready()], timeout=max(deadline - time.monotonic(), 0))
                if not ready:
                    for group in groups:
                        remove_placement_group(group)
                    raise TimeoutError(
                        f"placement groups for process_on_nodes={self.process_on_nodes} with bundle {self.bundle()} "
                        f"(one node each) not ready after {timeout_s:.0f} s; Ray has {ray.available_resources()}"
                    )
            self._placement_groups = groups
        return self._placement_groups

    def node_ids(self) -> list[str]:
        """The Ray node id of each node's placement group, in node order (after :meth:`placement_groups`)."""
        return [placement_group_table(group)["bundles_to_node_id"][0] for group in self.placement_groups()]

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
