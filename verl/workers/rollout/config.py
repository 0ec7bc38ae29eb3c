"""Settings of the rollout engine and its sampling (``actor_rollout_ref.rollout``).

Read by :func:`verl.workers.rollout.build_rollout_engine` (engine construction) and
:func:`verl.trainer.ppo.rollout_adapter.sampling_params` (per-turn sampling); the ``log_prob_*`` keys
size the actor's ``old_log_probs`` pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

ENGINE_NAMES = ("vllm", "hf")
ROLLOUT_MODES = ("sync", "async")


@dataclass(frozen=True)
class ValidationSampling:
    """Sampling at validation (``rollout.val_kwargs``): greedy unless ``do_sample``."""

    do_sample: bool = False
    """sample at validation; `false` is truly greedy (temperature 0), which Search-R1 meant but did not do"""
    temperature: float = 0.0
    """validation temperature when sampling; `do_sample: true` needs it above 0 (rejected at start)"""
    top_p: float = 1.0
    """validation nucleus mass when sampling"""
    top_k: int = -1
    """validation top-k when sampling (-1: off)"""
    n: int = 1
    """responses per validation prompt (metrics are per response)"""


@dataclass(frozen=True)
class RolloutConfig:
    """The colocated generation engine: which one, its memory, and how it samples in training."""

    name: str = "vllm"
    """engine: `vllm` or `hf` (transformers `generate`)"""
    temperature: float = 1.0
    """sampling temperature in training (it also divides the logits of the log-prob passes, so > 0)"""
    top_k: int = -1
    """top-k in training (-1: off)"""
    top_p: float = 0.95
    """nucleus mass in training (Search-R1's default)"""
    do_sample: bool = True
    """sample in training (`false`: greedy)"""
    n: int = 1
    """responses per prompt (GRPO group size; the paper's GRPO: 5)"""
    n_agent: int = 1
    """Search-R1's name for `n`, used when `n` is 1 (both above 1 must agree)"""
    seed: int = 0
    """engine seed (vLLM `LLM(seed=)`, the hf engine's generator)"""
    seed_per_request: bool = True
    """vLLM: training request i of a run gets seed `seed + i`, so samples do not depend on batching; hf:
    each generate call is seeded with `seed`. `false`: the engine's RNG samples (spares vLLM on GPU a
    generator call per sequence per decode step)"""
    dtype: str = "bfloat16"
    """engine dtype (`float32` on CPU)"""
    gpu_memory_utilization: float = 0.6
    """vLLM's share of the GPU memory"""
    kv_cache_space_gib: Optional[float] = None
    """vLLM on CPU only: KV cache size in GiB (fractions allowed; `null`: 2), held for the whole
    run except while released during training; a `VLLM_CPU_KVCACHE_SPACE` environment variable wins"""
    enforce_eager: Optional[bool] = None
    """vLLM without CUDA graphs / torch.compile; `null`: eager on CPU, graphs on GPU (Search-R1 had
    `true`; graphs cost ~1 min more engine start-up)"""
    free_cache_engine: bool = True
    """release the engine's KV cache (GPU: sleep mode; CPU: its storage) during the training phases"""
    tensor_model_parallel_size: int = 1
    """vLLM tensor-parallel degree"""
    engine_process: bool = False
    """vLLM: the engine core (scheduler and model) in a process of its own, so its steps overlap the
    trainer-side output processing; weights still reach it in memory (CUDA IPC on a GPU). `false`:
    everything in the actor's worker process. Tensor-parallel degree 1 only"""
    frontend_process: bool = False
    """vLLM: the whole engine (its front end too: request setup and the per-decode-step output loop,
    detokenisation for the stop strings, log-probs) in a child process of the worker, which keeps
    only a pipe and sends weights as a CUDA IPC handle; with `engine_process` the core runs in a
    process of its own below it. The worker's Python then runs free of the engine's: what
    `staleness=1` needs for its log-prob and update passes to overlap the rollout. Sync rollout
    (`mode=sync`), tensor-parallel degree 1"""
    max_num_batched_tokens: Optional[int] = None
    """vLLM scheduler: tokens per engine step (`null`: vLLM's default for the platform)"""
    max_num_seqs: Optional[int] = None
    """vLLM scheduler: sequences decoded together (`null`: vLLM's default)"""
    max_model_len: Optional[int] = None
    """engine context length; `null`: derived from the data budgets (`data.max_prompt_length +
    data.max_response_length`: the longest context the search loop sends plus one turn); a set
    value below that is rejected at start"""
    mode: str = "sync"
    """multi-turn rollout: `sync` (Search-R1's loop: each turn generates for all active rows, then one
    batched search) or `async` (a task per trajectory: a row searches while others decode;
    docs/architecture.md, Rollout modes); `+recipe=learning_gpu` and `+recipe=paper_scale_one_gpu` set `async`"""
    staleness: int = 0
    """policy updates a training batch's sampling policy may lag the one it trains: `0` samples each
    step's batch with the current weights; `1` rolls out step k+1's batch while step k trains (with the
    weights before step k's update; the update's weight push waits for it), so on `trainer.backend=ray`
    generation overlaps old/ref log-probs and the update. Needs vLLM, the engine resident
    (`free_cache_engine=false`) and truncated importance sampling (`actor.tis_imp_ratio_cap` > 0),
    which corrects the lag with the rollout's recorded log-probs"""
    calculate_log_probs: bool = False
    """also return the engine's log-prob of every sampled token (`rollout_log_probs`) when nothing in the
    step reads them; truncated importance sampling (`actor.tis_imp_ratio_cap` > 0, so `staleness=1`)
    always gets them. Off, vLLM computes no log-softmax over the vocabulary per decode step
    (docs/benchmarks.md, What the rollout's sampling settings cost)"""
    log_prob_micro_batch_size: Optional[int] = 128
    """global rows per `old_log_probs` micro-batch (split over ranks)"""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """rows per `old_log_probs` micro-batch per rank; wins over the global one"""
    log_prob_use_dynamic_bsz: Optional[bool] = None
    """token-count micro-batches (`null`: the actor's `use_dynamic_bsz`)"""
    log_prob_max_token_len_per_gpu: Optional[int] = None
    """token budget per micro-batch (`null`: the actor's `ppo_max_token_len_per_gpu`)"""
    val_kwargs: ValidationSampling = field(default_factory=ValidationSampling)
    """sampling at validation"""


def engine_max_model_len(rollout: RolloutConfig, data) -> int:
    """The engine's context length: ``rollout.max_model_len``, or the data budgets when null.

    The search loop sends contexts of up to ``data.max_prompt_length`` tokens and asks for up to
    ``data.max_response_length`` new ones per turn, so the engine needs their sum.

    Raises:
        ValueError: a set ``max_model_len`` below that sum, naming both numbers.
    """
    needed = data.max_prompt_length + data.max_response_length
    if rollout.max_model_len is None:
        return needed
    if rollout.max_model_len < needed:
        raise ValueError(f"actor_rollout_ref.rollout.max_model_len={rollout.max_model_len} is below "
                         f"data.max_prompt_length + data.max_response_length = {data.max_prompt_length} + "
                         f"{data.max_response_length} = {needed}; raise it or set it to null")
    return rollout.max_model_len
