"""One real Ray session per controller test module (2 CPU worker processes on a 2-core machine).

Module scope, not session scope: a Ray session left running would hold the CPUs that later test
packages (workers, sft, trainer) reserve for their own placement groups."""

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def ray_session():
    import ray

    from verl.single_controller import init_ray

    init_ray(
        num_cpus=2,
        env_vars={"PYTHONPATH": os.pathsep.join([HERE, os.getcwd(), os.environ.get("PYTHONPATH", "")])},
        object_store_memory=200 * 1024**2,
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def cpu_pool(ray_session):
    """Two CPU ranks on this node; actors take 0.2 CPU so several groups and the driver fit."""
    from verl.single_controller import RayResourcePool

    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=4, cpus_per_worker=0.2)
    yield pool
    pool.release()
