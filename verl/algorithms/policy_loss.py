"""Policy losses, registered by name (``actor.policy_loss.loss_mode``), and the clipped value loss.

Each policy loss has the signature::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
       config=None, rollout_is_weights=None) -> (pg_loss, metrics)

with all tensors ``(batch, response_len)``; ``pg_loss`` is a scalar tensor and ``metrics`` holds
python floats under ``actor/pg_clipfrac``, ``actor/ppo_kl`` and ``actor/pg_clipfrac_lower``.
``config`` is the actor config (attributes ``clip_ratio``, ``clip_ratio_low`` / ``clip_ratio_high``
(None -> ``clip_ratio``), ``clip_ratio_c``: the dual-clip bound) or None (see :func:`clip_ranges`).
``rollout_is_weights`` (detached, ``(batch, response_len)``) multiplies the per-token loss
(truncated importance sampling, see ``importance_sampling``). A registration may restrict
``loss_agg_mode``; the start-up check asks the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from verl.algorithms import registry
from verl.algorithms.masked import agg_loss, masked_mean

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss and the ``loss_agg_mode`` values it is defined for (None: all)."""

    fn: PolicyLossFn
    loss_agg_modes: tuple[str, ...] | None = None


POLICY_LOSS_REGISTRY: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str, *, loss_agg_modes: tuple[str, ...] | None = None
                         ) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register a policy loss under ``name`` (and the aggregation modes it accepts).

    Raises:
        ValueError: ``name`` is already registered to a different function.
    """

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        registry.add(POLICY_LOSS_REGISTRY, "policy loss", name, PolicyLoss(fn, loss_agg_modes))
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    """The registry entry of ``name``.

    Raises:
        ValueError: unknown name, listing the known ones.
    """
    return registry.lookup(POLICY_LOSS_REGISTRY, "policy loss", name)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """Return the policy loss function registered as ``name``; ValueError listing known names otherwise."""
    return get_policy_loss(name).fn


def clip_ranges(config: Any) -> tuple[float, float, float]:
    """``(clip_ratio_low, clip_ratio_high, clip_ratio_c)`` from a policy-loss config.

    ``config`` has attributes ``clip_ratio``, ``clip_ratio_low``/``clip_ratio_high`` (None: use
    ``clip_ratio``) and ``clip_ratio_c`` (the actor config), or is None for PPO's usual
    ``(0.2, 0.2, 3.0)``.

    Raises:
        ValueError: ``clip_ratio_c <= 1`` (the dual-clip bound must exceed 1, Ye et al. 2020).
    """
    if config is None:
        return 0.2, 0.2, 3.0
    low = config.clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    high = config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    if config.clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 for dual-clip PPO, got {config.clip_ratio_c}")
    return float(low), float(high), float(config.clip_ratio_c)


def _check_same_shape(**tensors: torch.Tensor | None) -> None:
    shapes = {key: tuple(t.shape) for key, t in tensors.items() if t is not None}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) with clip-higher and dual-clip.

    Per token, ``rho = exp(log_prob - old_log_prob)`` (log-ratio clamped to [-20, 20]):
    ``L = max(-A * rho, -A * clip(rho, 1 - clip_ratio_low, 1 + clip_ratio_high))``
    (asymmetric bounds: DAPO, Yu et al. 2025); for ``A < 0`` additionally
    ``L = min(L, -A * clip_ratio_c)`` (dual-clip, Ye et al. 2020, "Mastering Complex Control in
    MOBA Games", eq. 5). Aggregated with ``loss_agg_mode`` over ``response_mask``.

    Metrics: ``actor/pg_clipfrac`` share of masked tokens where the clipped term is active,
    ``actor/pg_clipfrac_lower`` share where the dual-clip bound is active (``A < 0``),
    ``actor/ppo_kl`` masked mean of ``old_log_prob - log_prob`` (k1 estimate of KL(old||new)).
    """
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                      response_mask=response_mask, rollout_is_weights=rollout_is_weights)
    clip_low, clip_high, clip_c = clip_ranges(config)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = torch.minimum(loss_ppo, -advantages * clip_c)
    negative = advantages < 0
    pg_losses = torch.where(negative, loss_dual, loss_ppo)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), response_mask).item(),
            "actor/ppo_kl": masked_mean(-log_ratio, response_mask).item(),
            "actor/pg_clipfrac_lower": masked_mean(
                ((loss_ppo > -advantages * clip_c) & negative).float(), response_mask).item(),
        }
    return pg_loss, metrics


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", eqs. 7 and 13, GSPO-token).

    Sequence ratio ``s_i = exp(mean_{t in mask} (log_prob - old_log_prob))`` (geometric mean of the
    token ratios). Per token, ``s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]``: its value is ``s_i``
    and its gradient flows through the token's own log-prob. Loss per token
    ``max(-A * s_{i,t}, -A * clip(s_{i,t}, 1 - clip_ratio_low, 1 + clip_ratio_high))``; the
    paper uses very small clip ranges (3e-4 / 4e-4) and ``loss_agg_mode="seq-mean-token-mean"``
    (veRL lets the caller choose; it is respected here). No dual clip:
    ``actor/pg_clipfrac_lower`` is 0.
    """
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                      response_mask=response_mask, rollout_is_weights=rollout_is_weights)
    clip_low, clip_high, _ = clip_ranges(config)
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))  # clamp: overflow guard, as veRL
    loss_unclipped = -advantages * seq_ratio
    loss_clipped = -advantages * torch.clamp(seq_ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), response_mask).item(),
            "actor/ppo_kl": masked_mean(-log_ratio, response_mask).item(),
            "actor/pg_clipfrac_lower": 0.0,
        }
    return pg_loss, metrics


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, float]:
    """Clipped value loss (PPO2 baselines; Schulman et al. 2017 implementation).

    ``v_clip = clip(vpreds, values - cliprange_value, values + cliprange_value)``;
    per token ``max((vpreds - returns)^2, (v_clip - returns)^2)``; ``vf_loss = 0.5 * agg``.
    All tensors ``(batch, response_len)``; ``values`` are the critic's pre-update predictions.

    Returns:
        ``(vf_loss scalar tensor, vf_clipfrac float)``: share of masked tokens where the clipped
        error is the larger one.
    """
    _check_same_shape(vpreds=vpreds, returns=returns, values=values, response_mask=response_mask)
    vpreds_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpreds_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode)
    with torch.no_grad():
        vf_clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask).item()
    return vf_loss, vf_clipfrac
