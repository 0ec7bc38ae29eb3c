"""A small Ray job that outgrows the machine's memory, ended the way the trainer ends (``run_or_exit``).

    RAY_memory_usage_threshold=F python tests/controller/memory_job.py CAP_GIB

One rank of :class:`controller_workers.MemoryHog` allocates up to ``CAP_GIB`` GiB; with the
threshold a little above the machine's current use, Ray's memory monitor kills it first.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from controller_workers import MemoryHog  # noqa: E402

from verl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray  # noqa: E402
from verl.trainer.run_exit import run_or_exit  # noqa: E402


def job(cap_gib: float) -> float:
    init_ray(num_cpus=1, object_store_memory=100 * 1024**2,
             env_vars={"PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.abspath(__file__)),
                                                      os.environ.get("PYTHONPATH", "")])})
    group = RayWorkerGroup(RayResourcePool(process_on_nodes=[1], use_gpu=False, cpus_per_worker=0.2),
                           RayClassWithInitArgs(MemoryHog), name_prefix="memory")
    try:
        return group.grow(cap_gib)[0]
    finally:
        group.shutdown()


if __name__ == "__main__":
    print(f"held {run_or_exit(lambda: job(float(sys.argv[1])))} GiB without being stopped", flush=True)
