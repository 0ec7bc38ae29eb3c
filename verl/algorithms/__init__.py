"""PPO-family algorithms as pure tensor functions: the one import point for trainer and workers.

Modules (one job each): ``masked`` (masked statistics, loss aggregation), ``advantage`` (estimator
registry), ``policy_loss`` (policy-loss registry, value loss), ``kl`` (KL estimators and
controllers, entropy), ``importance_sampling`` (rollout/trainer truncated IS), ``llds`` (the
likelihood-preserving regulariser of the actor loss). This package sits
below the workers and the trainer, which both import it.

Add an estimator or a policy loss by name with ``@register_adv_est("name", needs_groups=...)`` /
``@register_policy_loss("name", loss_agg_modes=...)`` and select it from the config
(``algorithm.adv_estimator``, ``actor_rollout_ref.actor.policy_loss.loss_mode``); the start-up
check reads each entry's requirements from the registry.
"""

from __future__ import annotations

from typing import Any

from verl.algorithms.advantage import (
    ADV_ESTIMATOR_REGISTRY,
    ActionTime,
    AdvantageEstimator,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator,
    get_adv_estimator_fn,
    register_adv_est,
    returns_to_go,
)
from verl.algorithms.importance_sampling import TIS_LEVELS, TIS_MODES, compute_rollout_is_weights
from verl.algorithms.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_entropy_from_logits,
    get_kl_controller,
    kl_penalty,
)
from verl.algorithms.llds import LLDS_GATES, compute_llds_loss
from verl.algorithms.masked import LOSS_AGG_MODES, agg_loss, masked_mean, masked_sum, masked_var, masked_whiten
from verl.algorithms.policy_loss import (
    POLICY_LOSS_REGISTRY,
    PolicyLoss,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    compute_value_loss,
    get_policy_loss,
    get_policy_loss_fn,
    register_policy_loss,
)


def compute_advantage(data: Any, adv_estimator: str, gamma: float = 1.0, lam: float = 1.0,
                      norm_adv_by_std_in_grpo: bool = True, **kwargs) -> Any:
    """Run the estimator named ``adv_estimator`` on a DataProto and store its outputs.

    Reads ``batch["token_level_rewards"]``, ``batch["response_mask"]``, ``batch["values"]`` (if
    present) and ``non_tensor_batch["uid"]`` (if present) and writes ``batch["advantages"]`` and
    ``batch["returns"]``, all ``(batch, response_len)``. Returns ``data`` (modified in place).

    Raises:
        ValueError: unknown estimator, missing key, or the estimator's own errors.
    """
    for key in ("token_level_rewards", "response_mask"):
        if key not in data.batch.keys():
            raise ValueError(f"compute_advantage: DataProto has no batch key {key!r}")
    values = data.batch["values"] if "values" in data.batch.keys() else None
    estimator = get_adv_estimator_fn(adv_estimator)
    advantages, returns = estimator(
        data.batch["token_level_rewards"], data.batch["response_mask"], values=values,
        index=data.non_tensor_batch.get("uid"), gamma=gamma, lam=lam,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, **kwargs)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


__all__ = [
    "ADV_ESTIMATOR_REGISTRY", "POLICY_LOSS_REGISTRY", "KL_ESTIMATORS", "KL_CONTROLLERS", "LOSS_AGG_MODES",
    "TIS_LEVELS", "TIS_MODES", "LLDS_GATES", "AdvantageEstimator", "PolicyLoss",
    "register_adv_est", "get_adv_estimator", "get_adv_estimator_fn", "register_policy_loss", "get_policy_loss",
    "get_policy_loss_fn",
    "compute_gae_advantage_return", "compute_grpo_outcome_advantage", "compute_rloo_outcome_advantage",
    "compute_reinforce_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage", "ActionTime", "returns_to_go",
    "compute_advantage", "compute_llds_loss",
    "masked_sum", "masked_mean", "masked_var", "masked_whiten", "agg_loss",
    "compute_policy_loss_vanilla", "compute_policy_loss_gspo", "compute_value_loss",
    "compute_entropy_from_logits", "kl_penalty", "FixedKLController", "AdaptiveKLController",
    "get_kl_controller", "apply_kl_penalty", "compute_rollout_is_weights",
]
