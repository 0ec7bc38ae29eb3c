"""LocalWorkerGroup (in-process, world size 1) and the dispatch planning, without Ray."""

import os

import pytest
import torch
from controller_workers import ActorRole, RefRole, SumWorker

import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller import ClassWithInitArgs, Dispatch, LocalWorkerGroup, create_colocated_worker_cls
from verl.single_controller.base.decorator import collect_results, plan_calls
from verl.single_controller.base.worker import RANK_ENV_VARS


def test_dp_plan_pads_chunks_and_collect_unpads():
    data = DataProto.from_dict(tensors={"x": torch.arange(5)}, non_tensors={"uid": list("abcde")})
    plan = plan_calls(Dispatch.DP_COMPUTE_PROTO, 2, "m", (data, 7), {})
    assert plan.pad_size == 1 and plan.padded_rows == 6
    (arg0, extra0), _ = plan.calls[0]
    assert arg0.batch["x"].tolist() == [0, 1, 2] and extra0 == 7
    assert plan.calls[1][0][0].batch["x"].tolist() == [3, 4, 0]  # padding repeats row 0
    out = collect_results(Dispatch.DP_COMPUTE_PROTO, plan, {1: plan.calls[1][0][0], 0: arg0}, "m")
    assert out.batch["x"].tolist() == [0, 1, 2, 3, 4] and list(out.non_tensor_batch["uid"]) == list("abcde")
    with pytest.raises(ValueError, match="no DataProto"):
        plan_calls(Dispatch.DP_COMPUTE_PROTO, 2, "m", (1,), {})


def test_local_group_runs_registered_methods_in_process():
    # another in-process test may have left a process group; the group must only undo what it made
    initialized_before = dist.is_initialized()
    env_before = {key: os.environ.get(key) for key in RANK_ENV_VARS}
    group = LocalWorkerGroup(ClassWithInitArgs(SumWorker, scale=2.0))
    try:
        assert group.world_size == 1 and dist.get_world_size() == 1 and os.environ["WORLD_SIZE"] == "1"
        info = group.worker_info()[0]
        assert info == {"rank": 0, "world_size": 1, "local_rank": 0, "pid": os.getpid(),
                        "hostname": info["hostname"], "torch_threads": torch.get_num_threads()}
        out = group.double_and_tag(DataProto.from_dict(tensors={"x": torch.ones(3, 2)}, non_tensors={"uid": ["a", "b", "c"]}))
        torch.testing.assert_close(out.batch["y"], torch.full((3, 2), 4.0))
        assert group.echo_with_rank([9]) == [(0, 9)] and group.slow_pid().get() == [os.getpid()]
    finally:
        group.shutdown()
    assert dist.is_initialized() == initialized_before
    # a child started after the group (an SFT run, torchrun) must not inherit its rendezvous
    assert {key: os.environ.get(key) for key in RANK_ENV_VARS} == env_before


def test_local_colocated_roles_spawn():
    fused = LocalWorkerGroup(
        create_colocated_worker_cls({"actor_rollout": ClassWithInitArgs(ActorRole), "ref": ClassWithInitArgs(RefRole, factor=3.0)})
    )
    try:
        groups = fused.spawn(prefix_set=["actor_rollout", "ref"])
        assert groups["actor_rollout"].pid() == groups["ref"].pid() == [os.getpid()]
        assert fused.actor_rollout_weight_sum() == [3.0]
        out = groups["ref"].scaled(DataProto.from_dict(tensors={"x": torch.ones(2)}))
        assert out.batch["ref"].tolist() == [3.0, 3.0]
        with pytest.raises(ValueError, match="critic"):
            fused.spawn(prefix_set=["critic"])
    finally:
        fused.shutdown()


def test_a_cpu_rank_takes_its_share_of_the_cores_it_may_use(monkeypatch):
    # under `pytest -n 2` each worker is pinned to one core, where the Ray test of this rule cannot
    # tell it from Ray's one-thread default: the rule itself, on 8 cores
    from verl.single_controller.base.worker import Worker

    chosen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.delenv("SEARCH_R1_CPU_THREADS", raising=False)
    for local_ranks in (1, 2, 3, 16):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
        Worker()._share_cpu_threads()
    monkeypatch.setenv("SEARCH_R1_CPU_THREADS", "3")
    Worker()._share_cpu_threads()
    assert chosen == [8, 4, 2, 1, 3]
