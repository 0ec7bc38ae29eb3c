"""Advantage estimators, registered by name (``algorithm.adv_estimator``).

Each estimator has the signature::

    fn(token_level_rewards, response_mask, *, values=None, index=None, gamma=1.0, lam=1.0,
       norm_adv_by_std_in_grpo=True, epsilon=1e-6, **kwargs) -> (advantages, returns)

with ``token_level_rewards``, ``response_mask``, ``values``, ``advantages`` and ``returns`` all of
shape ``(batch, response_len)`` and ``index`` a numpy array ``(batch,)`` of group ids (the
per-prompt ``uid``). Advantages are 0 wherever ``response_mask`` is 0.

Multi-turn responses interleave action tokens (mask 1) with observation tokens (mask 0). The
token-level recursions (GAE, REINFORCE++) therefore run in "action time": an observation token
neither discounts nor bootstraps, and a reward that sits on an observation token (e.g. a response
truncated inside ``<information>``) is credited to the last action token before it. With masks
that are only right padding this is exactly veRL's computation.

Group estimators (GRPO, RLOO, REINFORCE++-baseline) give advantage 0 to every member of a group
with a single member or with all-equal scores: there is nothing to compare against (veRL instead
passes a lone member's raw score through).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from verl.algorithms import registry
from verl.algorithms.masked import masked_whiten

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator and what it needs from the rest of the run.

    ``needs_critic``: it reads ``values`` (a critic must be trained); ``needs_groups``: it compares
    the responses of one prompt, so ``rollout.n`` must be at least 2.
    """

    fn: AdvantageFn
    needs_critic: bool = False
    needs_groups: bool = False


ADV_ESTIMATOR_REGISTRY: dict[str, AdvantageEstimator] = {}


def register_adv_est(name: str, *, needs_critic: bool = False,
                     needs_groups: bool = False) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register an advantage estimator under ``name`` with its requirements.

    Raises:
        ValueError: ``name`` is already registered to a different function.
    """

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        registry.add(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name,
                     AdvantageEstimator(fn, needs_critic=needs_critic, needs_groups=needs_groups))
        return fn

    return decorator


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The registry entry of ``name``.

    Raises:
        ValueError: unknown name, listing the known ones.
    """
    return registry.lookup(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name)


def get_adv_estimator_fn(name: str) -> AdvantageFn:
    """Return the estimator function registered as ``name``; ValueError listing known names otherwise."""
    return get_adv_estimator(name).fn


def _check_same_shape(**tensors: torch.Tensor | None) -> None:
    shapes = {key: tuple(t.shape) for key, t in tensors.items() if t is not None}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")


class ActionTime:
    """A batch's action tokens in "action time" (module docstring): each row's mask-1 tokens moved
    to its front, in order, the other tokens after them.

    Args:
        mask: ``response_mask`` ``(batch, response_len)``, 0/1.
    Attributes:
        action: ``(batch, response_len)``, 1 over the first ``mask.sum(-1)`` entries of each row.
    """

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask
        count = mask.cumsum(-1)  # actions at or before each token
        self._slot = (count - 1).clamp_min(0).long()  # an action's own slot; the last action's before it
        after = count[:, -1:] + (1 - mask).cumsum(-1) - 1  # other tokens keep their order behind the actions
        self._dest = torch.where(mask.bool(), self._slot, after.long())
        self._started = (count > 0).to(mask.dtype)
        self.action = (torch.arange(mask.shape[-1], device=mask.device) < count[:, -1:]).to(mask.dtype)

    def compact(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(batch, response_len)`` in action time, 0 past each row's actions."""
        return torch.zeros_like(x).scatter_(-1, self._dest, x) * self.action

    def rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        """Rewards in action time, a reward on a mask-0 token credited to the last action at or before
        it (e.g. a response truncated inside ``<information>``); one before a row's first action is
        dropped (no action can have earned it)."""
        return torch.zeros_like(rewards).scatter_add_(-1, self._slot, rewards * self._started)

    def restore(self, y: torch.Tensor) -> torch.Tensor:
        """An action-time tensor back at its tokens' positions; 0 on mask-0 tokens."""
        return y.gather(-1, self._dest) * self.mask


_MIN_POWER = 1e-280
"""smallest discount power the closed form below divides by (float64 keeps ~1e-308)"""


def _suffix_sum(x: torch.Tensor, discount: float) -> torch.Tensor:
    """``y_k = x_k + discount * y_{k+1}`` along the last dim (``y`` past the end is 0), ``(batch, n)``.

    Closed form ``y_k = discount^-k * sum_{j >= k} discount^j x_j`` as one reverse cumulative sum in
    float64: each partial sum holds only terms at most ``discount^k`` times the largest ``|x|``, so
    dividing by ``discount^k`` loses nothing. Where ``discount^(n-1)`` would underflow (a discount
    well below 1 over a long response) the recursion runs as a loop over positions instead.
    """
    n = x.shape[-1]
    if discount == 0:
        return x.clone()
    if discount ** max(n - 1, 0) >= _MIN_POWER:
        powers = discount ** torch.arange(n, dtype=torch.float64, device=x.device)
        scaled = (x.to(torch.float64) * powers).flip(-1).cumsum(-1).flip(-1)
        return (scaled / powers).to(x.dtype)
    y = torch.zeros_like(x)
    running = torch.zeros_like(x[:, 0])
    for k in reversed(range(n)):
        running = x[:, k] + discount * running
        y[:, k] = running
    return y


@register_adv_est("gae", needs_critic=True)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, eq. 16), whitened.

    ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t = delta_t + gamma * lam * A_{t+1}``, with
    ``t`` running over action tokens only (see module docstring); ``returns = A + V`` before
    whitening; advantages are then whitened over the mask (PPO practice, as veRL).

    Args:
        token_level_rewards, response_mask, values: ``(batch, response_len)``.
        gamma: discount per action token; lam: GAE lambda.

    Raises:
        ValueError: ``values`` missing or shapes differ.
    """
    if values is None:
        raise ValueError("gae needs values (critic output, shape (batch, response_len))")
    _check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask, values=values)
    mask = response_mask.to(values.dtype)
    steps = ActionTime(mask)
    value = steps.compact(values)
    next_value = torch.nn.functional.pad(value[:, 1:], (0, 1))  # the next action token's; 0 after the last
    delta = (steps.rewards(token_level_rewards.to(values.dtype)) + gamma * next_value - value) * steps.action
    advantages = steps.restore(_suffix_sum(delta, gamma * lam))
    returns = (advantages + values) * mask
    advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


def returns_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted return-to-go in action time: ``G_t = r_t + gamma * G_{t+1}`` over action tokens.

    ``(batch, response_len)`` in and out, 0 off the mask; rewards on observation tokens are first
    credited to the action before them (:meth:`ActionTime.rewards`).
    """
    _check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    steps = ActionTime(response_mask.to(token_level_rewards.dtype))
    return steps.restore(_suffix_sum(steps.rewards(token_level_rewards), gamma))


@register_adv_est("reinforce")
def compute_reinforce_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE (Williams 1992, "Simple statistical gradient-following algorithms", eq. 11 with
    baseline b = 0): the advantage of an action token is its return-to-go, ``A_t = G_t``
    (:func:`returns_to_go`; with an outcome reward and gamma = 1 every token of a row gets the
    row's score). No critic, no group baseline, no whitening: the estimator Xu et al. 2026 ("How to
    Train Your Deep Research Agent?", arXiv:2602.19526, sec. 5) find better than PPO and more stable
    than GRPO for Search-R1. The stored copies of that paper did not show which baseline, if any,
    its REINFORCE used; this is the plain estimator (``reinforce_plus_plus_baseline`` and ``rloo``
    are the group-baseline variants). Returns ``(advantages, returns)``, equal.
    """
    returns = returns_to_go(token_level_rewards, response_mask, gamma)
    return returns, returns


@register_adv_est("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return-to-go, whitened over the batch.

    ``G_t = r_t + gamma * G_{t+1}`` over action tokens; advantages = ``masked_whiten(G)``.
    Returns ``(advantages, returns)``, both ``(batch, response_len)`` and 0 off the mask.
    """
    returns = returns_to_go(token_level_rewards, response_mask, gamma)
    mask = response_mask.to(returns.dtype)
    advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


def _group_stats(scores: torch.Tensor, index: np.ndarray | None) -> dict[str, torch.Tensor]:
    """Per-row statistics of each row's group: size, mean, unbiased std, all-equal flag.

    ``scores``: ``(batch,)``; ``index``: ``(batch,)`` hashable group ids. Returns tensors of
    shape ``(batch,)``.
    """
    if index is None:
        raise ValueError("group estimators need index (per-row group ids, e.g. non_tensor_batch['uid'])")
    index = np.asarray(index).reshape(-1)
    if len(index) != scores.shape[0]:
        raise ValueError(f"index has {len(index)} entries but the batch has {scores.shape[0]} rows")
    group_of: dict = {}
    ids = [group_of.setdefault(key, len(group_of)) for key in index.tolist()]
    gid = torch.tensor(ids, device=scores.device)
    num_groups = len(group_of)

    def per_group(values: torch.Tensor, reduce: str) -> torch.Tensor:
        out = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
        return out.scatter_reduce(0, gid, values, reduce=reduce, include_self=False)

    count = per_group(torch.ones_like(scores), "sum")[gid]
    mean = per_group(scores, "mean")[gid]
    sq_dev = per_group((scores - mean) ** 2, "sum")[gid]
    std = torch.sqrt(sq_dev / (count - 1).clamp_min(1))  # unbiased, as torch.std
    equal = per_group(scores, "amax")[gid] == per_group(scores, "amin")[gid]
    degenerate = (count < 2) | equal
    return {"count": count, "mean": mean, "std": std, "degenerate": degenerate}


def _outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    _check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    return token_level_rewards.sum(dim=-1)


def _broadcast(row_adv: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return row_adv.unsqueeze(-1) * response_mask.to(row_adv.dtype)


@register_adv_est("grpo", needs_groups=True)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: np.ndarray | None = None,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath, sec. 4.1.2).

    Score ``s_i = sum_t r_{i,t}``; within the group of row ``i`` (same ``index``):
    ``A_i = (s_i - mean) / (std + epsilon)`` (std unbiased), or ``A_i = s_i - mean`` when
    ``norm_adv_by_std_in_grpo`` is False (Dr. GRPO, Liu et al. 2025). Single-member and
    all-equal groups give 0. ``A_i`` is broadcast over the row's action tokens; returns = advantages.
    """
    scores = _outcome_scores(token_level_rewards, response_mask)
    stats = _group_stats(scores, index)
    centred = scores - stats["mean"]
    row_adv = centred / (stats["std"] + epsilon) if norm_adv_by_std_in_grpo else centred
    row_adv = torch.where(stats["degenerate"], torch.zeros_like(row_adv), row_adv)
    advantages = _broadcast(row_adv, response_mask)
    return advantages, advantages


@register_adv_est("rloo", needs_groups=True)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: np.ndarray | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, "Back to Basics", eq. 7): leave-one-out baseline.

    ``A_i = s_i - (1 / (n - 1)) * sum_{j != i} s_j = (s_i - mean) * n / (n - 1)`` over the ``n``
    rows of the group; single-member and all-equal groups give 0. Broadcast over action tokens.
    """
    scores = _outcome_scores(token_level_rewards, response_mask)
    stats = _group_stats(scores, index)
    count = stats["count"]
    row_adv = (scores - stats["mean"]) * count / (count - 1).clamp_min(1)
    row_adv = torch.where(stats["degenerate"], torch.zeros_like(row_adv), row_adv)
    advantages = _broadcast(row_adv, response_mask)
    return advantages, advantages


@register_adv_est("reinforce_plus_plus_baseline", needs_groups=True)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: np.ndarray | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262 v3+): group-mean baseline, batch whitening.

    ``A_i = s_i - mean(group)`` broadcast over action tokens, then whitened over all masked tokens
    of the batch. Single-member and all-equal groups give 0 before whitening.
    """
    scores = _outcome_scores(token_level_rewards, response_mask)
    stats = _group_stats(scores, index)
    row_adv = torch.where(stats["degenerate"], torch.zeros_like(scores), scores - stats["mean"])
    mask = response_mask.to(scores.dtype)
    advantages = masked_whiten(_broadcast(row_adv, mask), mask) * mask
    return advantages, advantages
