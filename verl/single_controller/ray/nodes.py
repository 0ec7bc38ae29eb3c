"""The nodes of the Ray cluster: what each offers, and which of them are lost.

A node is lost when Ray's control store (GCS) marks it dead or when its raylet no longer accepts a
connection. The second test matters: the GCS marks a node dead only after its health checks fail
(``health_check_period_ms x health_check_failure_threshold``, 15 s by Ray's defaults), while the
ranks that shared a collective with the lost node's ranks fail within a second (gloo/NCCL see the
peer's socket close). Probing the raylet tells, at that moment, whether a peer's node is gone.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import ray

# How long a raylet may take to accept a TCP connection before its node counts as lost: a live
# raylet accepts at once (the kernel does, even when the raylet is busy); a powered-off machine
# never answers, so this bounds the wait.
RAYLET_PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RayNode:
    """One node as the GCS lists it.

    Args:
        node_id: Ray's hex node id (what ``ray.get_runtime_context().get_node_id()`` gives a worker).
        ip: the node's address.
        raylet_port: the raylet's port (``ray start --node-manager-port``).
        alive: the GCS's view.
        resources: the node's total resources (``{"CPU": 8.0, "GPU": 8.0, ...}``).
    """

    node_id: str
    ip: str
    raylet_port: int
    alive: bool
    resources: dict[str, float]

    def describe(self) -> str:
        """``<id> (<ip>)``, how errors and the placement name a node."""
        return f"{self.node_id} ({self.ip})"


def cluster_nodes() -> list[RayNode]:
    """Every node the GCS knows, alive or dead (the driver must be connected to Ray)."""
    return [RayNode(node_id=n["NodeID"], ip=n["NodeManagerAddress"], raylet_port=int(n["NodeManagerPort"]),
                    alive=bool(n["Alive"]), resources=dict(n.get("Resources", {})))
            for n in ray.nodes()]


def raylet_answers(node: RayNode, timeout_s: float = RAYLET_PROBE_TIMEOUT_S) -> bool:
    """Whether the node's raylet accepts a TCP connection within ``timeout_s``."""
    try:
        with socket.create_connection((node.ip, node.raylet_port), timeout=timeout_s):
            return True
    except OSError:
        return False


def lost_nodes(node_ids: list[str]) -> list[RayNode]:
    """Those of ``node_ids`` that are dead in the GCS, unknown to it, or whose raylet does not answer."""
    known = {node.node_id: node for node in cluster_nodes()}
    lost = []
    for node_id in dict.fromkeys(node_ids):  # each node once, in order
        node = known.get(node_id)
        if node is None:
            lost.append(RayNode(node_id, "unknown address", 0, False, {}))
        elif not node.alive or not raylet_answers(node):
            lost.append(node)
    return lost
