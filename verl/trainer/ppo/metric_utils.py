"""Step metrics under veRL's names, computed from the finished batch and the timings.

critic/score|rewards|advantages|returns|values/{mean,max,min}: over response tokens (scores and
rewards summed per sequence first); response_length/{mean,max,min,clip_ratio}; prompt_length/* and
context_length/* (prompt + response tokens of a row); env/* from the
agent loop's and the environment's per-row stats; timing_s/*; perf/{throughput_tokens_per_s,mfu/actor};
val/*: per-question statistics over the whole validation set (never means of batch means).
"""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import torch

from verl.workers.rollout.agent_loop.packing import LOOP_STATS


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def _masked(tensor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return tensor[mask.bool()]


def compute_data_metrics(batch, use_critic: bool, env=None) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values, lengths and ``env/*`` figures of one training
    batch (``env``: the run's environment, for its own figures)."""
    tensors = batch.batch
    mask = tensors["response_mask"]
    responses = tensors["responses"]
    response_width = responses.shape[-1]
    response_length = tensors["attention_mask"][:, -response_width:].sum(-1).float()
    prompt_length = tensors["attention_mask"][:, :-response_width].sum(-1).float()
    metrics = {}
    metrics.update(_stats("critic/score", tensors["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", tensors["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", _masked(tensors["advantages"], mask)))
    metrics.update(_stats("critic/returns", _masked(tensors["returns"], mask)))
    if use_critic and "values" in tensors.keys():
        values = _masked(tensors["values"], mask)
        returns = _masked(tensors["returns"], mask)
        metrics.update(_stats("critic/values", values))
        variance = torch.var(returns)
        metrics["critic/vf_explained_var"] = (1.0 - torch.var(returns - values) / (variance + 1e-5)).item()
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = _clip_ratio(batch, response_length, response_width)
    metrics.update(_stats("prompt_length", prompt_length))
    # a row's whole context (prompt, turns, observations): the engine's max_model_len must hold its max
    metrics.update(_stats("context_length", prompt_length + response_length))
    metrics.update(env_metrics(row_stats(batch, env), env))
    return metrics


def row_stat(batch, key: str) -> np.ndarray | None:
    """A per-row statistic of the rollout as floats, from the tensors or the non-tensors."""
    if batch.batch is not None and key in batch.batch.keys():
        return batch.batch[key].float().numpy()
    if key in batch.non_tensor_batch:
        return batch.non_tensor_batch[key].astype(float)
    return None


def _clip_ratio(batch, response_length: torch.Tensor, response_width: int) -> float:
    """Share of rows cut by the length budget (the manager's ``truncated`` flag when it gives one)."""
    truncated = row_stat(batch, "truncated")
    if truncated is not None:
        return float(truncated.mean())
    return (response_length >= response_width).float().mean().item()


def env_metrics(stats: dict[str, np.ndarray | None], env=None, prefix: str = "env") -> dict[str, float]:
    """The ``<prefix>/*`` statistics over rows: each figure is a mean (or max/min) over every row given.

    The loop's: ``number_of_actions/{mean,max,min}`` (turns) and ``finish_ratio``; the environment's
    own figures from its counters (``Environment.metrics``, e.g. Search-R1's valid and empty searches).

    Args:
        stats: per-row arrays (B,) under ``turns``, ``finished`` and the environment's counter names;
            a missing or None entry leaves its metrics out.
        env: the run's environment, or None for the loop's figures only.
    """
    turns, finished = stats.get("turns"), stats.get("finished")
    metrics = {}
    if turns is not None and len(turns):
        metrics.update({f"{prefix}/number_of_actions/mean": turns.mean(),
                        f"{prefix}/number_of_actions/max": turns.max(),
                        f"{prefix}/number_of_actions/min": turns.min()})
    if finished is not None and len(finished):
        metrics[f"{prefix}/finish_ratio"] = finished.mean()
    if env is not None:
        metrics.update(env.metrics(stats, prefix))
    return {k: float(v) for k, v in metrics.items()}


def stat_keys(env=None) -> tuple[str, ...]:
    """The per-row statistics of a rollout: the loop's (``turns``, ``finished``, ``truncated``) and
    the environment's counters."""
    return (*LOOP_STATS, *(env.counters if env is not None else ()))


def row_stats(batch, env=None) -> dict[str, np.ndarray | None]:
    """:func:`stat_keys` of a rollout batch, as float arrays (None where absent)."""
    return {key: row_stat(batch, key) for key in stat_keys(env)}


def compute_timing_metrics(timings: dict[str, float]) -> dict[str, float]:
    return {f"timing_s/{name}": seconds for name, seconds in timings.items()}


def device_peak_flops(configured: float | None) -> float:
    """Peak FLOP/s of one device: the configured value, a known GPU's bf16 dense peak, or a CPU
    estimate (cores x 2.5 GHz x 32 fp32 FLOP/cycle for AVX2 FMA)."""
    if configured:
        return float(configured)
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        for key, peak in (("H200", 989e12), ("H100", 989e12), ("A100", 312e12), ("L40", 181e12),
                          ("A10", 125e12), ("4090", 165e12)):
            if key in name:
                return peak
        return 100e12
    return (os.cpu_count() or 1) * 2.5e9 * 32


def compute_throughput_metrics(num_tokens: int, timings: dict[str, float], num_params: int,
                               ppo_epochs: int, num_devices: int, peak_flops: float) -> dict[str, float]:
    """Tokens per second over the whole step and the actor's model-FLOPs utilisation.

    Actor FLOPs: 2N per token for the old-log-prob forward plus 6N per token per PPO epoch for the
    update (Kaplan et al. 2020), over the time of those two phases on ``num_devices`` devices.
    """
    step_time = timings.get("step", 0.0)
    metrics = {"perf/total_num_tokens": float(num_tokens)}
    if step_time > 0:
        metrics["perf/throughput_tokens_per_s"] = num_tokens / step_time
    actor_time = timings.get("old_log_prob", 0.0) + timings.get("update_actor", 0.0)
    if actor_time > 0 and num_params > 0:
        flops = num_params * num_tokens * (2 + 6 * ppo_epochs)
        metrics["perf/mfu/actor"] = flops / (actor_time * peak_flops * max(1, num_devices))
    return metrics


def reduce_worker_metrics(metrics: dict) -> dict[str, float]:
    """Mean of lists (workers and micro-batches report several values per key)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (list, tuple, np.ndarray)):
            out[key] = float(np.mean([float(v) for v in value])) if len(value) else 0.0
        else:
            out[key] = float(value)
    return out


def compute_validation_metrics(data_sources: list[str], scores: list[float],
                               env_stats: dict[str, np.ndarray | None] | None = None,
                               matches: dict[str, list[float]] | None = None, env=None) -> dict[str, float]:
    """Validation figures, every one a per-row (per-question) statistic over the whole set.

    ``val/test_score/<data_source>`` and ``val/test_score/all``: mean reward per row;
    ``val/test_<name>/*`` the same for each per-row answer match in ``matches`` (``em``: exact
    match, ``f1``: token F1, ``cover_em``: gold contained in the answer, ``retrieved``: gold in an
    observation);
    ``val/env/*``: :func:`env_metrics` over all rows. How the rows were batched does not matter.

    Args:
        data_sources, scores: one entry per row.
        env_stats: per-row arrays (:func:`row_stats`), aligned with ``scores``.
        matches: per-row values by name (e.g. ``{"em": [...]}``), or None.
        env: the run's environment (its own ``val/env/*`` figures).
    Raises:
        ValueError: a ``matches`` list or an ``env_stats`` array has a different length than ``scores``.
    """
    metrics = _means_by_source("val/test_score", data_sources, scores)
    for name, values in (matches or {}).items():
        if len(values) != len(scores):
            raise ValueError(f"{len(values)} {name} values for {len(scores)} rows")
        metrics.update(_means_by_source(f"val/test_{name}", data_sources, values))
    for key, values in (env_stats or {}).items():
        if values is not None and len(values) != len(scores):
            raise ValueError(f"per-row stat {key!r} has {len(values)} values for {len(scores)} rows")
    metrics.update({f"val/{key}": value for key, value in env_metrics(env_stats or {}, env).items()})
    return metrics


def _means_by_source(prefix: str, data_sources: list[str], values: list[float]) -> dict[str, float]:
    by_source = defaultdict(list)
    for source, value in zip(data_sources, values):
        by_source[str(source)].append(float(value))
    metrics = {f"{prefix}/{source}": float(np.mean(group)) for source, group in by_source.items()}
    if len(values):
        metrics[f"{prefix}/all"] = float(np.mean(values))
    return metrics
