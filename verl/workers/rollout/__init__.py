"""Rollout engines: one interface (``base.RolloutEngine``), a vLLM and a transformers implementation.

``build_rollout_engine`` picks one from the ``actor_rollout_ref.rollout`` config.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Mapping

from verl.workers.rollout.base import RolloutEngine, RolloutOutput, SamplingParams

logger = logging.getLogger(__name__)

__all__ = ["RolloutEngine", "RolloutOutput", "SamplingParams", "build_rollout_engine", "default_engine_name"]

ENGINE_NAMES = ("vllm", "hf")


def default_engine_name() -> str:
    """``"vllm"`` wherever the vllm package is installed, else ``"hf"``."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


def _get(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if value is None else value


def _enforce_eager(value: Any) -> bool:
    """``rollout.enforce_eager``; None picks CUDA graphs (False) on a GPU and eager mode on CPU, where
    vLLM has no graphs and its torch.compile start-up costs minutes."""
    if value is None:
        import torch
        return not torch.cuda.is_available()
    return bool(value)


def build_rollout_engine(rollout_config: Mapping | None, model_path: str, tokenizer, model=None,
                         **overrides: Any) -> RolloutEngine:
    """Build the engine named by ``rollout_config.name`` (``"vllm"`` | ``"hf"``; default: vllm if installed).

    Keys read (all optional): ``name``, ``dtype`` (default float32), ``max_model_len`` (2048),
    ``tensor_model_parallel_size`` (1; ``tensor_parallel_size`` also read), ``gpu_memory_utilization`` (0.5), ``enforce_eager`` (None: eager on CPU only),
    ``executor_backend`` (vLLM executor, see vllm_rollout.py), ``kv_cache_space_gib`` (CPU KV cache,
    GiB), ``seed`` (0), ``max_batch_size`` (hf: rows decoded together, 64), ``device`` (hf: cuda when
    available, else cpu; ignored when ``model`` is given). ``overrides`` win over
    the config.

    Args:
        model_path: weights the engine starts from (vLLM always loads from here).
        tokenizer: the policy's tokenizer.
        model: an already loaded module (the actor's) for the hf engine to wrap instead of loading.
    Raises:
        ValueError: unknown engine name.
    """
    def get(key: str, default: Any) -> Any:
        return overrides.get(key, _get(rollout_config, key, default))

    name = get("name", default_engine_name())
    if name == "vllm":
        from verl.workers.rollout.vllm_rollout import VLLMRolloutEngine
        return VLLMRolloutEngine(
            model_path, dtype=str(get("dtype", "float32")), max_model_len=int(get("max_model_len", 2048)),
            tensor_parallel_size=int(get("tensor_model_parallel_size", get("tensor_parallel_size", 1))),
            gpu_memory_utilization=float(get("gpu_memory_utilization", 0.5)),
            enforce_eager=_enforce_eager(get("enforce_eager", None)), executor_backend=get("executor_backend", None),
            kv_cache_space_gib=get("kv_cache_space_gib", None), seed=int(get("seed", 0)))
    if name == "hf":
        import torch
        from verl.workers.rollout.hf_rollout import HFRolloutEngine
        dtype = getattr(torch, str(get("dtype", "float32")))
        device = get("device", "cuda" if torch.cuda.is_available() else "cpu")
        return HFRolloutEngine(tokenizer, model=model, model_path=model_path, dtype=dtype, device=device,
                               max_batch_size=int(get("max_batch_size", 64)), seed=int(get("seed", 0)))
    raise ValueError(f"rollout.name must be one of {ENGINE_NAMES}, got {name!r}")
