"""KL estimators, KL coefficient controllers, the in-reward KL penalty, and token entropy.

The sample-based estimators follow J. Schulman, "Approximating KL Divergence" (2020): with
``x ~ pi`` and ``log r = log pi_ref(x) - log pi(x)``, ``k1 = -log r``, ``k2 = (log r)^2 / 2``,
``k3 = (r - 1) - log r``; k1 and k3 are unbiased for KL(pi || pi_ref), k3 has low variance and is
never negative.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from verl.algorithms.masked import masked_mean

KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref), shape ``(batch, response_len)``.

    Args:
        log_prob, ref_log_prob: log-probs of the sampled tokens under the policy and the reference,
            ``(batch, response_len)``; for ``full``, logits or log-probs over the whole vocabulary,
            ``(batch, response_len, vocab)`` (both are normalised with ``log_softmax``).
        kl_penalty: ``kl``/``k1`` (``log_prob - ref_log_prob``), ``abs`` (its absolute value),
            ``mse``/``k2`` (half its square), ``low_var_kl``/``k3`` (``exp(ref - lp) - (ref - lp) - 1``,
            log-ratio clamped to [-20, 20] and result to [-10, 10] as veRL), ``full`` (exact
            ``sum_v pi(v) (log pi(v) - log pi_ref(v))``).

    The result is not masked: callers apply ``response_mask``.

    Raises:
        ValueError: unknown estimator, or ``full`` given tensors without a vocabulary dimension.
    """
    if kl_penalty in ("kl", "k1"):
        return log_prob - ref_log_prob
    if kl_penalty == "abs":
        return (log_prob - ref_log_prob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (log_prob - ref_log_prob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        log_r = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_r) - log_r - 1.0, min=-10.0, max=10.0)
    if kl_penalty == "full":
        if log_prob.dim() < 3 or log_prob.shape != ref_log_prob.shape:
            raise ValueError(
                "kl_penalty='full' needs logits or log-probs over the vocabulary, shape "
                f"(batch, response_len, vocab); got {tuple(log_prob.shape)} and {tuple(ref_log_prob.shape)}")
        log_p = F.log_softmax(log_prob.float(), dim=-1)
        log_q = F.log_softmax(ref_log_prob.float(), dim=-1)
        return (log_p.exp() * (log_p - log_q)).sum(-1).to(log_prob.dtype)
    raise ValueError(f"unknown kl_penalty {kl_penalty!r}; expected one of {list(KL_ESTIMATORS)}")


_kl_estimate = kl_penalty  # apply_kl_penalty's argument of the same name shadows the function


def compute_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``H = logsumexp(z) - sum_v softmax(z)_v z_v`` of the categorical over the last dim.

    ``logits``: ``(..., vocab)``; returns ``(...)``, in nats.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


class FixedKLController:
    """Constant KL coefficient ``beta`` (``algorithm.kl_ctrl.type=fixed``)."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient stays fixed."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning LMs from Human Preferences", 2.2).

    ``e = clip(KL / target_kl - 1, -0.2, 0.2)``; ``beta <- beta * (1 + e * n_steps / horizon)``:
    the coefficient grows when the measured KL exceeds the target and shrinks otherwise.

    Raises:
        ValueError: ``target_kl <= 0`` or ``horizon <= 0``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL controller needs target_kl > 0 and horizon > 0, "
                             f"got target_kl={target_kl}, horizon={horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adjust ``value`` after observing ``current_kl`` over ``n_steps`` samples."""
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


KL_CONTROLLERS = ("fixed", "adaptive")


def get_kl_controller(kl_ctrl_config: Any) -> FixedKLController | AdaptiveKLController:
    """Build a controller from ``algorithm.kl_ctrl`` (attributes ``type`` fixed|adaptive,
    ``kl_coef``, ``target_kl``, ``horizon``).

    Raises:
        ValueError: unknown ``type``.
    """
    kind = kl_ctrl_config.type
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_ctrl_config.kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(init_kl_coef=kl_ctrl_config.kl_coef, target_kl=kl_ctrl_config.target_kl,
                                    horizon=kl_ctrl_config.horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {kind!r}; expected one of {list(KL_CONTROLLERS)}")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL in the reward (Ziegler et al. 2019; ``algorithm.use_kl_in_reward``).

    ``token_level_rewards = token_level_scores - beta * KL_t * response_mask``; the measured KL
    (per-row masked mean, then batch mean) updates ``kl_ctrl`` with ``n_steps = batch``.
    All tensors ``(batch, response_len)``; ``old_log_prob`` may equally be the current log-probs.

    Returns:
        ``(token_level_rewards, {"actor/reward_kl_penalty": KL, "actor/reward_kl_penalty_coeff": beta})``
        with ``beta`` the coefficient used (before the controller update).
    """
    mask = response_mask.to(token_level_scores.dtype)
    kld = _kl_estimate(old_log_prob, ref_log_prob, kl_penalty) * mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, mask, dim=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
