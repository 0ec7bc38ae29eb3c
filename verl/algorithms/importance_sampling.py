"""Truncated importance sampling between the rollout engine and the trainer.

The engine (vLLM, bf16 kernels, different batching) samples from ``pi_rollout``, which differs
slightly from the trainer's ``pi_old`` for the same weights. Weighting the per-token policy loss
by ``min(pi_old / pi_rollout, cap)`` corrects this off-policy gap with bounded variance
(Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"; the
truncation is truncated IS as in Espeholt et al. 2018, IMPALA/V-trace).
"""

from __future__ import annotations

import math

import torch

from verl.algorithms.masked import masked_mean

TIS_LEVELS = ("token", "sequence")
TIS_MODES = ("truncate", "mask")


@torch.no_grad()
def compute_rollout_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float = 2.0,
    level: str = "token",
    mode: str = "truncate",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights ``pi_old / pi_rollout``, truncated or masked at ``cap``.

    Args:
        old_log_prob: trainer log-probs of the sampled tokens, ``(batch, response_len)``.
        rollout_log_probs: engine log-probs of the same tokens, ``(batch, response_len)``.
        response_mask: ``(batch, response_len)``, 1 on action tokens.
        cap: upper bound of the weight (``actor.tis_imp_ratio_cap``), > 0.
        level: ``token`` (one ratio per token) or ``sequence`` (product of the row's token ratios,
            the same weight on every token of the row).
        mode: ``truncate`` (weight ``min(ratio, cap)``) or ``mask`` (weight ``ratio`` if
            ``ratio <= cap`` else 0: drop the token or sequence).

    Returns:
        ``(weights, metrics)``: detached weights ``(batch, response_len)``, 0 off the mask;
        ``rollout_vs_actor_log_prob_diff`` (masked mean of ``|old - rollout|``), its max, and
        ``rollout_is_capped_ratio`` (share of masked tokens whose ratio exceeds ``cap``).

    Raises:
        ValueError: ``cap <= 0``, unknown ``level`` or ``mode``, or shapes differ.
    """
    if cap <= 0:
        raise ValueError(f"tis cap must be > 0, got {cap}")
    if level not in TIS_LEVELS:
        raise ValueError(f"unknown importance-sampling level {level!r}; expected one of {list(TIS_LEVELS)}")
    if mode not in TIS_MODES:
        raise ValueError(f"unknown importance-sampling mode {mode!r}; expected one of {list(TIS_MODES)}")
    if old_log_prob.shape != rollout_log_probs.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(f"shape mismatch: old_log_prob {tuple(old_log_prob.shape)}, rollout_log_probs "
                         f"{tuple(rollout_log_probs.shape)}, response_mask {tuple(response_mask.shape)}")
    mask = response_mask.to(old_log_prob.dtype)
    log_ratio = (old_log_prob - rollout_log_probs) * mask
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
    log_cap = math.log(cap)
    capped = log_ratio > log_cap
    # exp of the clamped log-ratio never overflows, even for long sequences
    weights = torch.exp(torch.clamp(log_ratio, max=log_cap))
    if mode == "mask":
        weights = torch.where(capped, torch.zeros_like(weights), weights)
    weights = weights * mask

    abs_diff = (old_log_prob - rollout_log_probs).abs()
    valid = mask.bool()
    metrics = {
        "rollout_vs_actor_log_prob_diff": masked_mean(abs_diff, mask).item(),
        "rollout_vs_actor_log_prob_diff_max": abs_diff[valid].max().item() if valid.any() else 0.0,
        "rollout_is_capped_ratio": masked_mean(capped.to(mask.dtype), mask).item(),
    }
    return weights, metrics
