"""Several nodes on Ray (issue 28): a real two-node cluster on this machine, started with the `ray`
CLI as a user starts one (`ray start --head`, `ray start --address=<head>`), each node with its own
CPU, and the trainer joining it through ``RAY_ADDRESS`` with nothing but ``trainer.nnodes=2``.

* Search-R1's 4-node x 8-GPU script submitted as it submits itself (``ray job submit`` to the
  head's job server, its overrides as written) with ``trainer.dry_run=true``: the plan for its 32
  ranks, checked against this cluster; and the plan of a run the cluster can hold, reserved one node
  per placement group;
* a 2-step GRPO run with one rank on each node (the node ids the workers report), FSDP over gloo
  across them (one checkpoint shard per rank), a checkpoint and a resume;
* the second node's raylet killed mid-run: one line naming the node and the latest checkpoint; the
  same command on a healthy cluster (a new second node) continues from it.

CPU only, a tiny random-init Qwen2 model with the real tokenizer, a real BM25 retriever.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest

from verl.single_controller.ray.nodes import RayNode
from verl.trainer.ppo import checkpointing
from verl.trainer.ppo.placement import PlacementPlan, fit_problems

from .helpers import REPO, main_env, read_metrics, run_main, search_r1_script, tiny_overrides, wait_for
from .local_cluster import LocalRayCluster

SCRIPT = REPO / "tests" / "trainer" / "data" / "search_r1_scripts" / "train_ppo_multinode_32b.args"
PLACED = re.compile(r"^  node (\d+): ranks ([\d, -]+) on Ray node ([0-9a-f]+) \(", re.M)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head node (with its job server) and a second node, 1 CPU each; every node started here is
    stopped at the end."""
    cluster = LocalRayCluster(tmp_path_factory.mktemp("ray", numbered=True))
    try:
        cluster.start_head(dashboard=True)
        cluster.add_node("second")
        cluster.node_ids()  # both joined
        yield cluster
    finally:
        cluster.stop()


def _two_node_overrides(model: str, data: dict, url: str, out) -> list[str]:
    """The tiny GRPO run, one rank on each of two nodes: 2 prompts x 2 responses, one group per rank."""
    return tiny_overrides(model, data, url, out, "grpo") + [
        "trainer.backend=ray", "trainer.nnodes=2", "trainer.n_gpus_per_node=1", "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size=2", "actor_rollout_ref.ref.log_prob_micro_batch_size=2",
        "trainer.save_freq=1", "trainer.export_hf=false"]


def _placement(stdout: str) -> dict[int, str]:
    """``{rank: node id}`` from the run's placement lines (each rank reports its own node id)."""
    ranks = {}
    for _, text, node_id in PLACED.findall(stdout):
        for rank in text.split(", "):
            ranks[int(rank)] = node_id
    return ranks


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + "\n" + result.stderr[-5000:]


# ------------------------------------------------------------------------------- the plan alone
def _node(node_id: str, cpus: float, gpus: float = 0, alive: bool = True) -> RayNode:
    resources = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    return RayNode(node_id, "10.0.0.1", 1, alive, resources)


def test_multinode_plan_needs_as_many_large_enough_alive_nodes():
    plan = PlacementPlan(nnodes=2, ranks_per_node=8, use_gpu=True, cpus_per_rank=1.0, roles=("actor", "rollout"),
                         rollout_engine="vllm", tensor_parallel=2)
    assert plan.node_bundle() == {"CPU": 8.0, "GPU": 8.0}
    assert fit_problems(plan, [_node("a", 96, 8), _node("b", 96, 8)]) == []
    (problem,) = fit_problems(plan, [_node("a", 96, 8), _node("b", 96, 4), _node("c", 96, 8, alive=False)])
    assert problem.startswith("trainer.nnodes=2 x trainer.n_gpus_per_node=8 needs 2 Ray node(s) holding 8 GPU, "
                              "8 CPU each; the cluster has 2 alive node(s), 1 of them large enough: a ")
    assert "node 1: ranks 8-15" in plan.describe() and "8 vllm engine(s) of 2 rank(s)" in plan.describe()
    uneven = PlacementPlan(nnodes=2, ranks_per_node=3, use_gpu=True, cpus_per_rank=1.0, roles=("actor", "rollout"),
                           rollout_engine="vllm", tensor_parallel=2)
    assert uneven.problems() == ["actor_rollout_ref.rollout.tensor_model_parallel_size=2 must divide "
                                "trainer.n_gpus_per_node=3: an engine's ranks share one node"]


def test_multinode_split_pools_plan_the_engines_apart_and_must_fit_together():
    """``actor_rollout_ref.hybrid_engine=false``: a training pool without the engine and a rollout pool
    of its own; pools that each fit a node may still not fit the cluster together."""
    from verl.trainer.ppo.config import load_config
    from verl.trainer.ppo.placement import plan_placement, total_problems
    from verl.trainer.ppo.run_plan import make_run_plan

    cfg = load_config({"trainer": {"n_gpus_per_node": 2}, "actor_rollout_ref": {"hybrid_engine": False},
                       "rollout": {"n_gpus_per_node": 6}, "data": {"train_batch_size": 256}})
    training, rollout = plan_placement(cfg, make_run_plan(cfg, 1), use_gpu=True)
    assert "rollout" not in training.roles and rollout.roles == ("rollout",) and rollout.world_size == 6
    assert rollout.describe().splitlines()[0] == ("rollout pool: 6 ranks = rollout.nnodes 1 x rollout.n_gpus_per_node "
                                                  "6; one placement group per node, each on a Ray node of its own")
    assert "6 vllm engine(s) of 1 rank(s), on ranks of their own" in rollout.describe()
    eight = [_node("a", 96, 8)]
    assert fit_problems(training, eight) == fit_problems(rollout, eight) == total_problems([training, rollout], eight) == []
    six = [_node("a", 96, 6)]
    assert fit_problems(training, six) == fit_problems(rollout, six) == []
    assert total_problems([training, rollout], six) == [
        "the pools (training, rollout) need 8 GPU, 8 CPU in all; the cluster's alive nodes have 6 GPU, 96 CPU"]


def test_multinode_join_refused_by_token_authentication_says_what_to_set(monkeypatch):
    """Ray's own refusal (a ConnectionError caused by InvalidAuthToken) becomes one line naming the fix."""
    from verl.single_controller.ray.init import _join_failure

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    refused = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    refused.__cause__ = RuntimeError("Failed to connect to GCS: RPC error: InvalidAuthToken: Authentication token is missing")
    assert _join_failure("10.0.0.1:6379", refused) == (
        "RAY_ADDRESS=10.0.0.1:6379: the cluster refused this process's token: it uses token authentication; set "
        "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<`ray get-auth-token` on the head> (docs/multinode.md)")
    assert _join_failure("10.0.0.1:6379", ConnectionError("timed out")).endswith(
        "cannot join the Ray cluster there (timed out); is it running (`ray status` on the head)?")


def test_multinode_dry_run_plans_search_r1_script_for_its_gpus(cluster, tiny_qwen_path, qa_parquet,
                                                               retriever_url, tmp_path):
    """Search-R1's example/multinode/train_ppo_multinode_32b.sh: `ray job submit --address=<job server>
    --runtime-env=verl/trainer/runtime_env.yaml -- python3 -m verl.trainer.main_ppo <its overrides>`
    from the repository root (4 nodes x 8 GPUs, TP 2, PPO with a critic) plus `trainer.dry_run=true`.
    The job's driver joins the cluster; the plan for its 32 ranks is printed, then the check against
    this 2-node CPU cluster stops it in one line, as the run itself would stop."""
    data = tmp_path / "data"
    data.mkdir()
    train = pd.read_parquet(qa_parquet["train"])  # the script's batch is 512 prompts: repeat the rows
    pd.concat([train] * (512 // len(train) + 1), ignore_index=True).to_parquet(data / "train.parquet")
    pd.read_parquet(qa_parquet["test"]).to_parquet(data / "test.parquet")
    module, overrides = search_r1_script(SCRIPT, {
        "$BASE_MODEL": tiny_qwen_path, "$DATA_DIR": str(data), "$EXPERIMENT_NAME": "multinode-32b",
        "$WAND_PROJECT": "Search-R1", "$N_NODES": "4"})
    assert module == "verl.trainer.main_ppo" and "trainer.nnodes=4" in overrides
    # where this machine's retriever and scratch space are; the plan flag
    local = [f"retriever.url={retriever_url}", f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.dry_run=true"]
    # the script's launcher; this interpreter for its `python3` (the script expects its environment active)
    submit = [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", f"--address={cluster.dashboard_url}",
              "--runtime-env=verl/trainer/runtime_env.yaml", "--", sys.executable, "-m", module]
    env = main_env(cluster.auth_env)
    env.pop("RAY_ADDRESS", None)  # the job server tells the job's driver where the cluster is
    result = subprocess.run(submit + overrides + local, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = result.stdout + result.stderr  # the job's log, tailed by `ray job submit`
    assert result.returncode != 0 and "Job entrypoint command failed with exit code 2" in out, out[-5000:]
    assert "placement plan: 32 ranks = trainer.nnodes 4 x trainer.n_gpus_per_node 8" in out
    assert "node 0: ranks 0-7; node 1: ranks 8-15; node 2: ranks 16-23; node 3: ranks 24-31" in out
    assert "16 vllm engine(s) of 2 rank(s), colocated with the actor, each inside one node" in out
    assert "one process hosting actor, rollout, reference, critic" in out
    errors = set(line for line in out.splitlines() if line.startswith("error: "))  # tailed, then repeated
    ids = cluster.node_ids()
    assert errors == {
        "error: trainer.nnodes=4 x trainer.n_gpus_per_node=8 needs 4 Ray node(s) holding 8 CPU each; the cluster "
        f"has 2 alive node(s), 0 of them large enough: {', '.join(i[:12] + ' (1 CPU)' for i in sorted(ids.values()))}. "
        "Add nodes (`ray start --address=<head>:<port>` on each; docs/multinode.md) or lower trainer.nnodes"}, out[-3000:]
    assert "Traceback" not in out and not (tmp_path / "ckpt").exists()


def test_multinode_dry_run_reserves_one_node_per_placement_group(cluster, tiny_qwen_path, qa_parquet,
                                                                 retriever_url, tmp_path):
    ids = cluster.node_ids()
    overrides = _two_node_overrides(tiny_qwen_path, qa_parquet, retriever_url, tmp_path / "run") + ["trainer.dry_run=true"]
    result = run_main(overrides, extra_env=cluster.driver_env(), timeout=300)
    _ok(result)
    line = next(line for line in result.stdout.splitlines() if line.startswith("cluster "))
    reserved = dict(re.findall(r"node (\d) -> Ray node ([0-9a-f]+)", line))
    assert "fits; placement groups reserved and released" in line
    assert sorted(reserved.values()) == sorted(ids.values())  # one group on each node
    assert "placement:" not in result.stdout and not (tmp_path / "run").exists()  # no worker, no output


def test_multinode_dry_run_reserves_split_pools_together(cluster, tiny_qwen_path, qa_parquet, retriever_url,
                                                         tmp_path):
    """One training rank and one engine rank of its own (1 CPU each): both pools reserved at once,
    one on each of the two 1-CPU nodes."""
    overrides = tiny_overrides(tiny_qwen_path, qa_parquet, retriever_url, tmp_path / "run", "grpo") + [
        "trainer.backend=ray", "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1",
        "trainer.dry_run=true"]
    result = run_main(overrides, extra_env=cluster.driver_env(), timeout=300)
    _ok(result)
    assert "rollout pool: 1 ranks = rollout.nnodes 1 x rollout.n_gpus_per_node 1" in result.stdout
    line = next(line for line in result.stdout.splitlines() if line.startswith("cluster "))
    reserved = re.findall(r"(rollout )?node 0 -> Ray node ([0-9a-f]+)", line)
    assert "fits; placement groups reserved and released" in line
    assert [pool for pool, _ in reserved] == ["", "rollout "]
    assert sorted(node for _, node in reserved) == sorted(cluster.node_ids().values())


# ------------------------------------------------------------------------------- runs on two nodes
@pytest.fixture(scope="module")
def two_step_run(cluster, tiny_qwen_path, qa_parquet, retriever_url, tmp_path_factory):
    """Two GRPO steps on the two nodes, a checkpoint after each: ``(overrides, output folder, result)``."""
    out = tmp_path_factory.mktemp("two_node_run")
    overrides = _two_node_overrides(tiny_qwen_path, qa_parquet, retriever_url, out)
    result = run_main(overrides + ["trainer.total_training_steps=2"], extra_env=cluster.driver_env())
    return overrides, out, result


def test_multinode_grpo_places_one_rank_on_each_node_and_checkpoints(cluster, two_step_run):
    overrides, out, result = two_step_run
    _ok(result)
    ids = cluster.node_ids()
    placed = _placement(result.stdout)  # which node gets node 0's group is Ray's choice
    assert sorted(placed) == [0, 1] and sorted(placed.values()) == sorted([ids["head"], ids["second"]])
    assert [row["step"] for row in read_metrics(out)] == [1, 2]
    actor = checkpointing.find_latest(out) / "actor"
    assert actor == out / "global_step_2" / "actor"
    # FSDP over gloo across the nodes: a world of 2, each rank wrote its own shard and state
    assert {p.name for p in actor.glob("extra_state_*")} == {f"extra_state_world_size_2_rank_{r}.pt" for r in (0, 1)}
    assert {p.name for p in (actor / "model_optim").glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}


def test_multinode_lost_node_ends_in_one_line_and_the_resume_continues(cluster, two_step_run, tmp_path):
    overrides, out, result = two_step_run
    _ok(result)
    lost_id = cluster.node_ids()["second"]
    command = overrides + ["trainer.total_training_steps=3"]
    log, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(log, "w") as stdout, open(err, "w") as stderr:  # files: a full pipe would stall the run
        proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *command], cwd=REPO,
                                env=main_env(cluster.driver_env()), stdout=stdout, stderr=stderr)
        try:  # the run resumed from step 2 on both nodes; step 3 starts: the second node goes
            wait_for(lambda: "resumed from" in log.read_text(), timeout=300, proc=proc)
            cluster.kill_raylet("second")
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    stdout, stderr = log.read_text(), err.read_text()
    assert f"resumed from {out / 'global_step_2'} at global step 2" in stdout
    assert proc.returncode == 1, stdout[-3000:] + stderr[-3000:]
    latest = checkpointing.find_latest(out)
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-5000:]
    lost_rank = next(rank for rank, node_id in _placement(stdout).items() if node_id == lost_id)
    assert errors[0].startswith(f"error: lost Ray node {lost_id} (")
    assert f"which ran worker rank(s) {lost_rank}, during " in errors[0]
    assert errors[0].endswith(f"the latest checkpoint is {latest} (the same command resumes from it)")

    cluster.add_node("replacement")  # a healthy cluster again: the same command continues
    ids = cluster.node_ids()
    assert set(ids) == {"head", "replacement"}
    result = run_main(command, extra_env=cluster.driver_env())
    _ok(result)
    assert f"resumed from {latest} at global step {int(latest.name.rsplit('_', 1)[1])}" in result.stdout
    assert sorted(_placement(result.stdout).values()) == sorted([ids["head"], ids["replacement"]])
    assert read_metrics(out)[-1]["step"] == 3 and checkpointing.find_latest(out) == out / "global_step_3"
