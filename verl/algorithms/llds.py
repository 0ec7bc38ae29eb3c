"""LLDS: the likelihood-preserving regulariser against GRPO's lazy likelihood displacement.

Deng et al. 2026, "On Group Relative Policy Optimization Collapse in Agent Search: The Lazy
Likelihood-Displacement" (arXiv:2512.04220, ICML 2026; v1 titled "On GRPO Collapse in Search-R1:
The Lazy Likelihood-Displacement Death Spiral"). In tool-integrated GRPO the likelihood of the
responses that should be reinforced stagnates or falls (LLD); falling likelihood makes responses
less confident, gradients grow and training collapses. LLDS adds a penalty that acts only where
the update lowered the likelihood of a response's action, and only on the tokens that lost
likelihood:

    L = L_policy + lambda * L_LLDS
    L_LLDS = agg_{t in y_i} [ 1[A_{i,t} >= 0] * 1[ sum_{k in a(t)} d_{i,k} > 0 ] * max(0, d_{i,t}) ]
    d_{i,t} = log pi_old(y_{i,t}) - log pi_theta(y_{i,t})

``a(t)`` is the action holding token ``t``: a maximal run of model tokens with a non-negative
advantage between two observations (the paper's action-level gate, "A-gate", its best variant) or
the whole response (``gate="response"``, the response-level "R-gate", v1's form). Rows with a
negative advantage (responses the update should make less likely) are never regularised.

What the stored copies of the paper's body did not show was read from the authors' public
implementation (github.com/vengdeng/LLDS-On-Group-Relative-Policy-Optimization-Collapse-in-Search-R1):
the preserving set (tokens with ``A >= 0``), the gates above, the aggregation (a token mean over
all response tokens, i.e. ``agg_loss`` with ``token-mean``; other ``loss_agg_mode`` values aggregate
the same way as the policy loss), and lambda = 0.2 in its training script. Its answer-masking
option (LLDS-MA) is not built here.

The gates are computed without gradient; the penalty's gradient flows through ``log pi_theta`` and
raises the likelihood of exactly the displaced tokens. With ``old_log_prob`` equal to the current
log-probs (the first mini-batch of a step) the term is 0.
"""

from __future__ import annotations

import torch

from verl.algorithms.masked import agg_loss

LLDS_GATES = ("action", "response")


def action_segments(mask: torch.Tensor) -> torch.Tensor:
    """Ids of the maximal runs of 1s of each row of ``mask`` ``(B, R)``: 1, 2, ... inside runs,
    0 outside (``(B, R)`` int64)."""
    mask = mask.bool()
    previous = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    starts = mask & ~previous
    return starts.long().cumsum(dim=-1) * mask.long()


def compute_llds_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    gate: str = "action",
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``L_LLDS`` of the module docstring (without lambda).

    Args:
        old_log_prob: ``(B, R)`` log-probs of the policy that generated the batch (no gradient).
        log_prob: ``(B, R)`` log-probs of the policy being updated.
        advantages: ``(B, R)`` advantages (the preserving set is ``A >= 0``).
        response_mask: ``(B, R)`` 1 on model tokens (observations and padding 0).
        gate: ``"action"`` (per action, between observations) or ``"response"`` (per response).
        loss_agg_mode: how the per-token penalties are aggregated (:func:`agg_loss`).
    Returns:
        ``(loss, metrics)``: the scalar loss and, as 0-d tensors, ``actor/llds_loss`` and
        ``actor/llds_active_tokens`` (share of the response tokens penalised).
    Raises:
        ValueError: an unknown ``gate`` or tensors of different shapes.
    """
    if gate not in LLDS_GATES:
        raise ValueError(f"LLDS gate must be one of {LLDS_GATES}, got {gate!r}")
    shapes = {tuple(t.shape) for t in (old_log_prob, log_prob, advantages, response_mask)}
    if len(shapes) > 1:
        raise ValueError(f"shape mismatch: {sorted(shapes)}")
    mask = response_mask.to(log_prob.dtype)
    displacement = old_log_prob - log_prob  # > 0 where the update lowered the token's likelihood
    with torch.no_grad():
        preserved = mask * (advantages >= 0).to(mask.dtype)
        segments = action_segments(preserved) if gate == "action" else preserved.long()
        sums = torch.zeros(mask.shape[0], mask.shape[1] + 1, dtype=log_prob.dtype, device=log_prob.device)
        sums.scatter_add_(-1, segments, displacement.detach() * preserved)
        gated = (sums > 0).to(mask.dtype).gather(-1, segments) * preserved  # segment 0 (outside) is never gated
    penalty = gated * torch.clamp(displacement, min=0.0)
    loss = agg_loss(penalty, response_mask, loss_agg_mode)
    with torch.no_grad():
        active = (gated * (displacement > 0).to(mask.dtype)).sum() / mask.sum().clamp_min(1.0)
    return loss, {"actor/llds_loss": loss.detach(), "actor/llds_active_tokens": active}
