"""RayWorkerGroup with 2 real CPU Ray actors: gloo collectives, dispatch modes, colocation, failures."""

import os
import time

import numpy as np
import pytest
import torch
from controller_workers import ActorRole, BrokenInitWorker, RefRole, SumWorker

from verl.protocol import DataProto
from verl.single_controller import (
    LocalWorkerGroup,
    PendingCall,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
    create_colocated_worker_cls,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sum_group(cpu_pool):
    group = RayWorkerGroup(cpu_pool, RayClassWithInitArgs(SumWorker, scale=1.5), name_prefix="sum", timeout_s=120)
    yield group
    group.shutdown()


def five_rows() -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(10, dtype=torch.float32).view(5, 2)},
        non_tensors={"uid": [f"u{i}" for i in range(5)]},
    )


def test_ranks_get_env_and_gloo_all_reduce(sum_group):
    infos = sum_group.worker_info()
    assert [i["rank"] for i in infos] == [0, 1]
    assert all(i["world_size"] == 2 for i in infos)
    assert infos[0]["pid"] != infos[1]["pid"] != os.getpid()
    # all_reduce of (rank + 0.5) over ranks 0 and 1 is 0.5 + 1.5 = 2 on every rank
    assert sum_group.all_reduce_rank(0.5) == [2.0, 2.0]


def test_cpu_ranks_share_the_cores_despite_rays_one_thread_default(sum_group):
    """Ray starts actors with OMP_NUM_THREADS=1; each CPU rank takes cores // local ranks instead."""
    cores = len(os.sched_getaffinity(0))
    assert [i["torch_threads"] for i in sum_group.worker_info()] == [max(1, cores // 2)] * 2
    single = RayWorkerGroup(RayResourcePool(process_on_nodes=[1], use_gpu=False, cpus_per_worker=0.2),
                            RayClassWithInitArgs(SumWorker), name_prefix="threads", timeout_s=120)
    try:
        assert single.worker_info()[0]["torch_threads"] == cores
    finally:
        single.shutdown()
        single.resource_pool.release()


def test_dp_compute_proto_pads_splits_and_keeps_order(sum_group):
    data = five_rows()
    out = sum_group.double_and_tag(data)
    assert len(out) == 5
    torch.testing.assert_close(out.batch["y"], data.batch["x"] * 3.0)
    # 5 rows padded to 6: rank 0 computes rows 0-2, rank 1 rows 3-4 plus one padding row (dropped)
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert list(out.non_tensor_batch["uid_out"]) == [f"u{i}" for i in range(5)]
    assert out.meta_info["chunk_rows"] == 3


def test_dp_compute_proto_unpads_multiple_outputs_per_row(sum_group):
    out = sum_group.two_samples_per_row(five_rows())
    expected = five_rows().batch["x"].repeat_interleave(2, dim=0)
    torch.testing.assert_close(out.batch["y"], expected)


def test_one_to_all_all_to_all_rank_zero_and_non_blocking(sum_group):
    assert sum_group.echo_with_rank([10, 20]) == [(0, 10), (1, 20)]
    with pytest.raises(ValueError, match="ALL_TO_ALL"):
        sum_group.echo_with_rank([10])
    assert sum_group.only_rank_zero() == 0
    pending = sum_group.slow_pid()
    assert isinstance(pending, PendingCall)
    assert pending.get() == [i["pid"] for i in sum_group.worker_info()]


def test_raising_worker_names_rank_method_and_traceback(sum_group):
    with pytest.raises(WorkerError) as info:
        sum_group.fail_on_rank(1)
    message = str(info.value)
    assert info.value.rank == 1
    assert "rank 1" in message and "SumWorker.fail_on_rank" in message
    assert "deliberate failure on rank 1" in message and "Traceback" in message
    assert sum_group.fail_on_rank(5) == [0, 1]  # the group still works afterwards


def test_killed_worker_surfaces_without_waiting_for_the_other_ranks(cpu_pool, tmp_path):
    """Rank 1 dies while rank 0 can only return after the test releases it, which it does only once
    the error arrived: the death is reported as such, ahead of rank 0's result. A group that waited
    for every rank would end in WorkerTimeoutError (not a WorkerDiedError) after timeout_s."""
    group = RayWorkerGroup(cpu_pool, RayClassWithInitArgs(SumWorker), name_prefix="die", timeout_s=600)
    release = tmp_path / "release"
    try:
        with pytest.raises(WorkerDiedError) as info:
            group.exit_on_rank_while_others_wait(1, str(release))
        assert info.value.rank == 1 and "exit_on_rank_while_others_wait" in str(info.value)
    finally:
        release.touch()
        group.shutdown()


def test_hung_collective_times_out(cpu_pool):
    """Rank 0 waits in a barrier rank 1 never joins: the group's deadline, not the call, ends the wait,
    and the error names the rank still out and the timeout."""
    group = RayWorkerGroup(cpu_pool, RayClassWithInitArgs(SumWorker), name_prefix="hang", timeout_s=4)
    try:
        with pytest.raises(WorkerTimeoutError) as info:
            group.hang_in_collective_unless_rank(1)
        assert info.value.ranks == [0]
        assert "hang_in_collective_unless_rank within 4 s" in str(info.value)
    finally:
        group.shutdown()


def test_failing_init_names_rank_and_frees_actors(cpu_pool):
    import ray

    with pytest.raises(WorkerError, match=r"rank \d failed in BrokenInitWorker.__init__[\s\S]*cannot start rank"):
        RayWorkerGroup(cpu_pool, RayClassWithInitArgs(BrokenInitWorker), name_prefix="broken", init_timeout_s=120)
    with pytest.raises(WorkerError, match="rank 0 failed in BrokenInitWorker.__init__"):
        LocalWorkerGroup(RayClassWithInitArgs(BrokenInitWorker))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = [a for a in ray.util.list_named_actors() if a.startswith("broken_")]
        if not alive:
            break
        time.sleep(0.5)
    assert not alive


def test_colocated_roles_share_processes(cpu_pool):
    bundle = create_colocated_worker_cls(
        {"actor_rollout": RayClassWithInitArgs(ActorRole), "ref": RayClassWithInitArgs(RefRole, factor=-1.0)}
    )
    fused = RayWorkerGroup(cpu_pool, bundle, name_prefix="coloc", timeout_s=120)
    try:
        groups = fused.spawn(prefix_set={"actor_rollout", "ref"})
        actor, ref = groups["actor_rollout"], groups["ref"]
        assert actor.pid() == ref.pid() == fused.ref_pid()
        assert len(set(actor.pid())) == 2
        assert ref.world() == [2, 2]
        assert actor.weight_sum() == [3.0, 6.0]
        out = ref.scaled(five_rows())
        torch.testing.assert_close(out.batch["ref"], -five_rows().batch["x"])
        assert not hasattr(actor, "scaled") and hasattr(fused, "actor_rollout_weight_sum")
    finally:
        fused.shutdown()


def test_local_group_matches_ray_group(sum_group):
    local = LocalWorkerGroup(RayClassWithInitArgs(SumWorker, scale=1.5))
    try:
        ray_out, local_out = sum_group.double_and_tag(five_rows()), local.double_and_tag(five_rows())
        torch.testing.assert_close(local_out.batch["y"], ray_out.batch["y"])
        np.testing.assert_array_equal(local_out.non_tensor_batch["uid_out"], ray_out.non_tensor_batch["uid_out"])
        assert local.all_reduce_rank(0.5) == [0.5]
        assert local.worker_info()[0]["pid"] == os.getpid()
        with pytest.raises(WorkerError, match="rank 0 failed in SumWorker.fail_on_rank"):
            local.fail_on_rank(0)
    finally:
        local.shutdown()
