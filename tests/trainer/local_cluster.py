"""A Ray cluster of several nodes on this machine, started with the `ray` CLI as a user starts one.

Each node is its own `ray start --block` process (`--head` for the first, `--address=<head>` for the
others) with its own CPUs, temp dir and ports, so it is a separate Ray node (its own raylet, object
store and worker processes), and nothing of another Ray instance on this machine is touched: no
default port, no default temp dir (so no `ray.init()` elsewhere finds it), its own authentication
token. `--block` keeps each node's processes under the one process we started; SIGTERM to it stops
that node's processes (`ray stop` would stop every Ray instance of this user).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

# The GCS marks a node dead after health_check_period_ms x failure_threshold (15 s by default);
# 1 s x 3 keeps a lost node's test short (the trainer does not wait for it: it probes the raylet).
HEALTH_CHECK_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free now (the sockets are held until all are chosen, so the system
    cannot hand out one twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _free_port_range(count: int) -> int:
    """The first of ``count`` consecutive ports that are free now (worker processes take them), below
    the system's ephemeral range (32768 and up on Linux), where :func:`_free_ports` draws from."""
    for _ in range(200):
        first = 10000 + secrets.randbelow(20000)
        try:
            for port in range(first, first + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports")


class LocalRayCluster:
    """Ray nodes started with the CLI; :meth:`stop` ends every one of them (and only them).

    Args:
        root: a folder for the nodes' logs and the token.
        cpus_per_node: the CPUs each node advertises.

    The nodes' Ray temp dirs live in a short folder of /tmp of their own (Ray's socket paths must fit
    in 107 characters), removed by :meth:`stop`.
    """

    def __init__(self, root: Path, cpus_per_node: int = 1) -> None:
        self.root = Path(root)
        self.cpus_per_node = cpus_per_node
        token = self.root / "auth_token"
        token.write_text(secrets.token_hex(32))
        # every process of the cluster, and every driver joining it, uses this token (Ray 2.60
        # authenticates by default once a token exists; worker nodes need the mode set explicitly)
        self.auth_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        self._handed_out: set[int] = set()
        self.port, self.dashboard_port = self._ports(2)
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, subprocess.Popen] = {}
        self.raylet_ports: dict[str, int] = {}
        self._node_ids: dict[str, str] = {}  # a node's id never changes: asked of the GCS once
        self.temp_root = tempfile.mkdtemp(prefix="raymn-", dir="/tmp")

    def _ports(self, count: int) -> list[int]:
        """Free ports never handed out to another node of this cluster (one may not have bound its own yet)."""
        while True:
            ports = _free_ports(count)
            if not self._handed_out.intersection(ports):
                self._handed_out.update(ports)
                return ports

    def driver_env(self) -> dict[str, str]:
        """What a process joining the cluster needs: its address and the token."""
        return {"RAY_ADDRESS": self.address, **self.auth_env}

    def _start(self, name: str, role_args: list[str]) -> None:
        workers = _free_port_range(40)
        raylet, objects, agent, agent_grpc, runtime_env, metrics = self._ports(6)
        self.raylet_ports[name] = raylet
        temp_dir = tempfile.mkdtemp(prefix=f"{name}-", dir=self.temp_root)
        command = [
            sys.executable, "-m", "ray.scripts.scripts", "start", "--block", *role_args,
            "--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus_per_node}", "--num-gpus=0",
            f"--object-store-memory={200 * 2**20}", f"--temp-dir={temp_dir}",
            f"--node-manager-port={raylet}", f"--object-manager-port={objects}",
            f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
            f"--min-worker-port={workers}", f"--max-worker-port={workers + 39}", "--disable-usage-stats",
            "--log-style=record"]
        env = dict(os.environ, **self.auth_env, **HEALTH_CHECK_ENV, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
        env.pop("RAY_ADDRESS", None)
        with open(self.root / f"{name}.log", "ab") as log:
            self.nodes[name] = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)

    def start_head(self, dashboard: bool = False) -> None:
        """Start the head (``ray start --head``); with ``dashboard``, its job server too (``ray job submit``
        talks to it at :attr:`dashboard_url`)."""
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}" if dashboard else None
        web = ["--include-dashboard=true", "--dashboard-host=127.0.0.1",
               f"--dashboard-port={self.dashboard_port}"] if dashboard else ["--include-dashboard=false"]
        (client,) = self._ports(1)
        self._start("head", ["--head", f"--port={self.port}", *web, f"--ray-client-server-port={client}"])
        self._wait_for_head()

    def _wait_for_head(self, timeout_s: float = 120.0) -> None:
        """Until the head's GCS accepts connections (the other nodes join it); fails if the head exits."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.nodes["head"].poll() is not None:
                raise AssertionError(f"the head node exited: {(self.root / 'head.log').read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the head's GCS did not listen within {timeout_s:.0f} s") from None
                time.sleep(0.5)

    def add_node(self, name: str) -> None:
        """Start a worker node joining the head (``ray start --address=<head>``)."""
        self._start(name, [f"--address={self.address}"])

    def node_ids(self, timeout_s: float = 120.0) -> dict[str, str]:
        """``{name: Ray node id}`` of the nodes started here whose `ray start` still runs, once all of them
        have joined (asked of the GCS by a short-lived driver, matched on each node's raylet port)."""
        running = [name for name, proc in self.nodes.items() if proc.poll() is None]
        if set(running) <= set(self._node_ids):
            return {name: self._node_ids[name] for name in running}
        # the answer's line is marked: Ray may print its own lines (a lagging raylet's warning) after it
        query = ("import json, ray; ray.init(); print('NODES ' + json.dumps([[n['NodeID'], n['NodeManagerPort'], "
                 "n['Alive']] for n in ray.nodes()]), flush=True)")
        env = dict(os.environ, **self.driver_env())
        deadline = time.monotonic() + timeout_s
        while True:
            if self.nodes["head"].poll() is not None:
                raise AssertionError(f"the head node exited: {(self.root / 'head.log').read_text()[-3000:]}")
            alive = {name: proc for name, proc in self.nodes.items() if proc.poll() is None}
            result = subprocess.run([sys.executable, "-c", query], env=env, capture_output=True, text=True,
                                    timeout=timeout_s)
            answer = [line for line in result.stdout.splitlines() if line.startswith("NODES ")]
            if result.returncode == 0 and answer:
                ports = {port: node_id for node_id, port, up in json.loads(answer[-1].removeprefix("NODES ")) if up}
                found = {name: ports[self.raylet_ports[name]] for name in alive if self.raylet_ports[name] in ports}
                if len(found) == len(alive):
                    self._node_ids.update(found)
                    return found
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes {sorted(alive)} not all up after {timeout_s:.0f} s: {result.stderr[-2000:]}")
            time.sleep(1)

    def kill_raylet(self, name: str) -> int:
        """SIGKILL the raylet of node ``name`` (a node lost as a crashed machine loses it); its pid.

        Returns once the node's `ray start` has seen it and stopped the node's other processes."""
        raylets = [p for p in psutil.Process(self.nodes[name].pid).children(recursive=True) if p.name() == "raylet"]
        assert len(raylets) == 1, raylets
        raylets[0].kill()
        self.nodes[name].wait(timeout=60)
        return raylets[0].pid

    def stop(self) -> None:
        """SIGTERM each node's `ray start` (it stops its node's processes); SIGKILL what is left of its
        process group after a grace period."""
        for proc in reversed(list(self.nodes.values())):  # worker nodes before the head
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.nodes.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the group we started (start_new_session)
            except ProcessLookupError:
                pass
        self.nodes = {}
        shutil.rmtree(self.temp_root, ignore_errors=True)
