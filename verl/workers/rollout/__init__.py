"""Rollout engines: one interface (``base.RolloutEngine``), a vLLM and a transformers implementation.

``build_rollout_engine`` picks one from the ``actor_rollout_ref.rollout`` config.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Mapping

from verl.utils.config import to_typed
from verl.workers.rollout.base import RolloutEngine, RolloutOutput, SamplingParams
from verl.workers.rollout.config import ENGINE_NAMES, RolloutConfig, engine_max_model_len

logger = logging.getLogger(__name__)

__all__ = ["RolloutEngine", "RolloutOutput", "SamplingParams", "build_rollout_engine", "default_engine_name"]


def default_engine_name() -> str:
    """``"vllm"`` wherever the vllm package is installed, else ``"hf"``."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


def _enforce_eager(value: bool | None) -> bool:
    """``rollout.enforce_eager``; None picks CUDA graphs (False) on a GPU and eager mode on CPU, where
    vLLM has no graphs and its torch.compile start-up costs minutes."""
    if value is None:
        import torch
        return not torch.cuda.is_available()
    return bool(value)


def build_rollout_engine(rollout_config: RolloutConfig | Mapping, model_path: str, tokenizer, model=None,
                         max_model_len: int | None = None, **engine_options: Any) -> RolloutEngine:
    """Build the engine named by ``rollout_config.name`` (``"vllm"`` | ``"hf"``).

    Args:
        rollout_config: a ``RolloutConfig`` or a mapping of its keys (``name``, ``dtype``,
            ``tensor_model_parallel_size``, ``engine_process``, ``frontend_process``, ``gpu_memory_utilization``, ``enforce_eager``,
            ``kv_cache_space_gib``, ``max_num_batched_tokens``, ``max_num_seqs``, ``seed``).
        model_path: weights the engine starts from (vLLM always loads from here).
        tokenizer: the policy's tokenizer.
        model: an already loaded module (the actor's) for the hf engine to wrap instead of loading.
        max_model_len: the engine length (the trainer passes
            :func:`verl.workers.rollout.config.engine_max_model_len`); None: ``rollout.max_model_len``,
            else what that function gives for the default data budgets.
        engine_options: engine constructor arguments outside the configuration (benchmarks and
            tools: vLLM's ``executor_backend``, ``extra_engine_kwargs``; hf's ``max_batch_size``, ``device``).
    Raises:
        ValueError: unknown engine name, or a malformed ``rollout_config`` (naming the key).
    """
    config = to_typed(RolloutConfig, rollout_config, "actor_rollout_ref.rollout")
    length = max_model_len or config.max_model_len
    if length is None:
        from verl.utils.dataset.config import DataConfig
        length = engine_max_model_len(config, DataConfig())
    if config.name == "vllm":
        from verl.workers.rollout.vllm_rollout import VLLMRolloutEngine
        scheduler = {"max_num_batched_tokens": config.max_num_batched_tokens, "max_num_seqs": config.max_num_seqs}
        extra = {**{k: v for k, v in scheduler.items() if v is not None}, **engine_options.pop("extra_engine_kwargs", {})}
        kwargs = dict(
            model_path=model_path, dtype=config.dtype, max_model_len=length,
            tensor_parallel_size=config.tensor_model_parallel_size, engine_process=config.engine_process,
            gpu_memory_utilization=config.gpu_memory_utilization, enforce_eager=_enforce_eager(config.enforce_eager),
            kv_cache_space_gib=config.kv_cache_space_gib, seed=config.seed, extra_engine_kwargs=extra,
            **engine_options)
        if config.frontend_process:
            from verl.workers.rollout.engine_process import EngineProcess
            return EngineProcess(**kwargs)
        return VLLMRolloutEngine(**kwargs)
    if config.name == "hf":
        import torch
        from verl.workers.rollout.hf_rollout import HFRolloutEngine
        options = {"device": "cuda" if torch.cuda.is_available() else "cpu", **engine_options}
        return HFRolloutEngine(tokenizer, model=model, model_path=model_path, dtype=getattr(torch, config.dtype),
                               seed=config.seed, **options)
    raise ValueError(f"actor_rollout_ref.rollout.name must be one of {list(ENGINE_NAMES)}, got {config.name!r}")
