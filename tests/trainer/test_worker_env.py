"""Ray worker environment: the CPU malloc settings and the GPU allocator setting reach ray.init (they only act
at process start)."""

from types import SimpleNamespace

from verl.single_controller.ray.init import CPU_MALLOC_ENV_VARS, GPU_ALLOCATOR_ENV_VARS
from verl.trainer.ppo import worker_setup
from verl.trainer.ppo.config import load_config
from verl.trainer.ppo.run_plan import make_run_plan


def test_the_default_is_the_malloc_settings_on_cpu_expandable_segments_on_gpu_and_a_mapping_replaces_it(
        monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    cfg = load_config({})
    assert cfg.trainer.worker_env_vars is None
    assert worker_setup.worker_env_vars(cfg, use_gpu=False) == CPU_MALLOC_ENV_VARS
    assert CPU_MALLOC_ENV_VARS == {"MALLOC_ARENA_MAX": "2"}
    assert worker_setup.worker_env_vars(cfg, use_gpu=True) == GPU_ALLOCATOR_ENV_VARS
    assert GPU_ALLOCATOR_ENV_VARS == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    # the user's own allocator setting, inherited by the workers, is left alone
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    assert worker_setup.worker_env_vars(cfg, use_gpu=True) == {}
    cfg = load_config({"trainer": {"worker_env_vars": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}}})
    assert worker_setup.worker_env_vars(cfg, use_gpu=True) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    cfg = load_config({"trainer": {"worker_env_vars": {"MALLOC_ARENA_MAX": 4}}})
    assert worker_setup.worker_env_vars(cfg, use_gpu=False) == {"MALLOC_ARENA_MAX": "4"}
    cfg = load_config({"trainer": {"worker_env_vars": {}}})
    assert worker_setup.worker_env_vars(cfg, use_gpu=False) == {}


def test_start_group_passes_them_to_init_ray(monkeypatch):
    import verl.single_controller.ray as ray_pkg
    import verl.single_controller.ray.init as ray_init
    from verl.trainer.ppo import placement

    seen = {}
    monkeypatch.setattr(ray_init, "init_ray", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(ray_pkg, "RayResourcePool", lambda **kwargs: "pool")
    monkeypatch.setattr(ray_pkg, "RayWorkerGroup", lambda pool, bundle: SimpleNamespace(pool=pool, bundle=bundle,
                                                                                         rank_nodes={0: "n"}))
    monkeypatch.setattr(placement, "check_placement", lambda pools: None)
    monkeypatch.setattr(placement, "describe_ranks", lambda rank_nodes, plan: "placement: 1 rank")
    monkeypatch.setattr(worker_setup, "use_gpu", lambda: False)
    cfg = load_config({"trainer": {"n_gpus_per_node": 1}})
    [group] = worker_setup._start_groups(cfg, make_run_plan(cfg, 1), ["bundle"])
    assert (group.pool, group.bundle) == ("pool", "bundle")
    assert seen["env_vars"] == CPU_MALLOC_ENV_VARS
