"""Policy losses (PPO clip / clip-higher / dual-clip, GSPO) and the clipped value loss,
checked element by element against the case analysis of their papers, plus exact-zero
gradients on masked tokens."""

import math

import pytest
import torch

from verl.workers.actor.config import ActorConfig
from verl.trainer.ppo.core_algos import (
    LOSS_AGG_MODES,
    POLICY_LOSS_REGISTRY,
    agg_loss,
    compute_entropy_from_logits,
    compute_value_loss,
    get_policy_loss_fn,
    kl_penalty,
    masked_mean,
    register_policy_loss,
)

CONFIG = ActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
RATIOS = [0.5, 0.79, 0.9, 1.0, 1.1, 1.27, 1.5, 2.5, 5.0]


def ppo_token_loss(ratio, adv, low, high, clip_c):
    """PPO-clip (Schulman et al. 2017 eq. 7) by cases, with dual-clip (Ye et al. 2020 eq. 5)."""
    if adv > 0:
        return -adv * min(ratio, 1 + high)
    if adv < 0:
        return min(-adv * max(ratio, 1 - low), -adv * clip_c)
    return 0.0


def ratio_grid():
    ratios = torch.tensor([RATIOS, RATIOS], dtype=torch.float64)
    advantages = torch.tensor([[1.5] * len(RATIOS), [-2.0] * len(RATIOS)], dtype=torch.float64)
    old_log_prob = torch.full_like(ratios, -1.3)
    return old_log_prob, old_log_prob + ratios.log(), advantages, ratios


def test_vanilla_element_by_element_cases():
    old_lp, lp, adv, ratios = ratio_grid()
    mask = torch.ones_like(adv)
    mask[0, 0] = 0.0  # a masked token must not count anywhere
    loss, metrics = get_policy_loss_fn("vanilla")(old_lp, lp, adv, mask, "token-mean", CONFIG)
    cells = [(r, a) for r_row, a_row, m_row in zip(ratios.tolist(), adv.tolist(), mask.tolist())
             for r, a, m in zip(r_row, a_row, m_row) if m]
    expected = [ppo_token_loss(r, a, 0.2, 0.28, 3.0) for r, a in cells]
    assert loss.item() == pytest.approx(sum(expected) / len(expected), rel=1e-12)
    clipped = [(a > 0 and r > 1.28) or (a < 0 and r < 0.8) for r, a in cells]
    lower = [a < 0 and r > 3.0 for r, a in cells]
    assert metrics["actor/pg_clipfrac"] == pytest.approx(sum(clipped) / len(cells))
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(sum(lower) / len(cells))
    assert metrics["actor/ppo_kl"] == pytest.approx(mean_neg_log([r for r, _ in cells]), rel=1e-9)


def mean_neg_log(ratios):
    return sum(-math.log(r) for r in ratios) / len(ratios)


def test_clip_ratio_sets_both_bounds_and_dual_clip_bound_checked():
    old_lp, lp, adv, ratios = ratio_grid()
    mask = torch.ones_like(adv)
    loss, _ = get_policy_loss_fn("vanilla")(old_lp, lp, adv, mask, "token-mean",
                                           ActorConfig(clip_ratio=0.1, clip_ratio_low=None, clip_ratio_high=None))
    expected = [ppo_token_loss(r, a, 0.1, 0.1, 3.0) for r, a in zip(ratios.flatten().tolist(), adv.flatten().tolist())]
    assert loss.item() == pytest.approx(sum(expected) / len(expected), rel=1e-12)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1.0"):
        get_policy_loss_fn("vanilla")(old_lp, lp, adv, mask, "token-mean", ActorConfig(clip_ratio_c=1.0))


def test_rollout_is_weights_multiply_per_token_loss():
    old_lp, lp, adv, _ = ratio_grid()
    mask = torch.ones_like(adv)
    weights = torch.rand(adv.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for name in ("vanilla", "gspo"):
        fn = get_policy_loss_fn(name)
        weighted, _ = fn(old_lp, lp, adv, mask, "seq-mean-token-sum", CONFIG, rollout_is_weights=weights)
        # the loss is linear in the weights: a weight vector with a single 1 isolates one token
        per_token = torch.zeros_like(adv)
        for i in range(adv.shape[0]):
            for t in range(adv.shape[1]):
                one_hot = torch.zeros_like(adv)
                one_hot[i, t] = 1.0
                per_token[i, t] = fn(old_lp, lp, adv, mask, "seq-mean-token-sum", CONFIG, rollout_is_weights=one_hot)[0]
        assert weighted.item() == pytest.approx((per_token * weights).sum().item(), rel=1e-10)


def test_gspo_sequence_ratio_value_and_gradient():
    """GSPO-token (Zheng et al. 2025 eqs. 13-14): value uses s_i, gradient -A_i s_i / |y_i| per token."""
    gen = torch.Generator().manual_seed(1)
    old_lp = -torch.rand(3, 5, dtype=torch.float64, generator=gen) * 2
    lp = (old_lp + 0.05 * torch.randn(3, 5, dtype=torch.float64, generator=gen)).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)[:, None].expand(3, 5).contiguous()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.float64)
    config = ActorConfig(clip_ratio_low=0.02, clip_ratio_high=0.03)
    loss, metrics = get_policy_loss_fn("gspo")(old_lp, lp, adv, mask, "seq-mean-token-mean", config)
    loss.backward()
    expected_loss, clipped_tokens = 0.0, 0
    for i in range(3):
        steps = [t for t in range(5) if mask[i, t]]
        s = math.exp(sum(lp[i, t].item() - old_lp[i, t].item() for t in steps) / len(steps))
        a = adv[i, 0].item()
        s_clip = min(max(s, 0.98), 1.03)
        token_loss = max(-a * s, -a * s_clip)
        expected_loss += token_loss / 3  # seq-mean of a constant per-token loss
        is_clipped = -a * s_clip > -a * s
        clipped_tokens += is_clipped * len(steps)
        for t in range(5):
            grad = 0.0 if (not mask[i, t] or is_clipped) else -a * s / len(steps) / 3
            assert lp.grad[i, t].item() == pytest.approx(grad, abs=1e-12)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(clipped_tokens / mask.sum().item())
    assert metrics["actor/pg_clipfrac_lower"] == 0.0


def test_value_loss_matches_loop():
    gen = torch.Generator().manual_seed(2)
    vpreds, returns, values = (torch.randn(4, 6, dtype=torch.float64, generator=gen) for _ in range(3))
    mask = (torch.rand(4, 6, generator=gen) > 0.3).double()
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    terms, clipped = [], []
    for v, g, old, m in zip(vpreds.flatten().tolist(), returns.flatten().tolist(),
                            values.flatten().tolist(), mask.flatten().tolist()):
        if m:
            v_clip = min(max(v, old - 0.2), old + 0.2)
            terms.append(max((v - g) ** 2, (v_clip - g) ** 2))
            clipped.append((v_clip - g) ** 2 > (v - g) ** 2)
    assert vf_loss.item() == pytest.approx(0.5 * sum(terms) / len(terms), rel=1e-12)
    assert vf_clipfrac == pytest.approx(sum(clipped) / len(clipped))


def gathered_log_probs(logits, tokens):
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("loss_name", ["vanilla", "gspo", "value", "kl_loss", "entropy"])
def test_masked_tokens_get_exactly_zero_gradient(batch_mask, mode, loss_name):
    gen = torch.Generator().manual_seed(3)
    batch, length, vocab = *batch_mask.shape, 11
    logits = torch.randn(batch, length, vocab, generator=gen).requires_grad_(True)
    tokens = torch.randint(0, vocab, (batch, length), generator=gen)
    log_prob = gathered_log_probs(logits, tokens)
    other = log_prob.detach() + 0.3 * torch.randn(batch, length, generator=gen)
    advantages = torch.randn(batch, length, generator=gen)
    if loss_name in ("vanilla", "gspo"):
        loss, _ = get_policy_loss_fn(loss_name)(other, log_prob, advantages, batch_mask, mode, CONFIG)
    elif loss_name == "value":  # the value head reads a scalar from the logits here
        loss, _ = compute_value_loss(logits.mean(-1), advantages, other, batch_mask, 0.1, mode)
    elif loss_name == "kl_loss":
        loss = agg_loss(kl_penalty(log_prob, other, "low_var_kl"), batch_mask, mode)
    else:
        loss = agg_loss(compute_entropy_from_logits(logits), batch_mask, mode)
    loss.backward()
    masked_grad = logits.grad[batch_mask == 0]
    assert torch.count_nonzero(masked_grad) == 0
    assert torch.count_nonzero(logits.grad[batch_mask == 1]) > 0


def test_policy_loss_registry():
    assert {"vanilla", "gspo"} <= set(POLICY_LOSS_REGISTRY)
    with pytest.raises(ValueError, match="unknown policy loss 'ppo2'.*'gspo'"):
        get_policy_loss_fn("ppo2")

    @register_policy_loss("test_reinforce")
    def reinforce(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                  config=None, rollout_is_weights=None):
        return agg_loss(-advantages * log_prob, response_mask, loss_agg_mode), {}

    try:
        old_lp, lp, adv, _ = ratio_grid()
        loss, _ = get_policy_loss_fn("test_reinforce")(old_lp, lp, adv, torch.ones_like(adv))
        assert loss.item() == pytest.approx(masked_mean(-adv * lp, torch.ones_like(adv)).item())
    finally:
        POLICY_LOSS_REGISTRY.pop("test_reinforce")


def test_policy_loss_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="shape mismatch"):
        get_policy_loss_fn("vanilla")(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
