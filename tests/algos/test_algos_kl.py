"""KL estimators on known categorical distributions, entropy, KL controllers, KL in the reward."""

import math

import pytest
import torch

from verl.algorithms.config import KLControlConfig
from verl.trainer.ppo.core_algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_entropy_from_logits,
    get_kl_controller,
    kl_penalty,
)

P = [0.5, 0.2, 0.2, 0.1]
Q = [0.4, 0.3, 0.1, 0.2]
EXACT_KL = sum(p * math.log(p / q) for p, q in zip(P, Q))


def test_each_estimator_formula_elementwise():
    lp = torch.tensor([[-0.1, -2.0, -0.7], [-5.0, -0.01, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[-0.3, -1.0, -0.7], [-0.2, -30.0, -1.5]], dtype=torch.float64)
    for i in range(2):
        for t in range(3):
            a, b = lp[i, t].item(), ref[i, t].item()
            k3 = math.exp(max(min(b - a, 20), -20)) - (b - a) - 1
            cases = {"kl": a - b, "k1": a - b, "abs": abs(a - b), "mse": 0.5 * (a - b) ** 2,
                     "k2": 0.5 * (a - b) ** 2, "low_var_kl": min(max(k3, -10), 10), "k3": min(max(k3, -10), 10)}
            for name, expected in cases.items():
                assert kl_penalty(lp, ref, name)[i, t].item() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert kl_penalty(lp, ref, "k3")[1, 1].item() == 10.0  # clamped as veRL


def test_sampled_estimators_are_unbiased_for_kl():
    """k1 and k3 are unbiased for KL(p||q) on samples x ~ p (Schulman 2020); k3 has lower variance."""
    gen = torch.Generator().manual_seed(0)
    p, q = torch.tensor(P, dtype=torch.float64), torch.tensor(Q, dtype=torch.float64)
    x = torch.multinomial(p, 200_000, replacement=True, generator=gen).view(400, 500)
    lp, ref = p.log()[x], q.log()[x]
    for name in ("k1", "k3"):
        est = kl_penalty(lp, ref, name)
        std_err = est.std().item() / math.sqrt(est.numel())
        assert abs(est.mean().item() - EXACT_KL) < 4 * std_err, name
    assert kl_penalty(lp, ref, "k3").var() < kl_penalty(lp, ref, "k1").var()
    assert (kl_penalty(lp, ref, "k3") >= 0).all()
    # k2 is biased but close for nearby distributions: E[k2] ~ KL to second order
    assert kl_penalty(lp, ref, "k2").mean().item() == pytest.approx(EXACT_KL, rel=0.15)


def test_full_kl_exact_from_logits_or_log_probs():
    logits_p = torch.log(torch.tensor(P, dtype=torch.float64)) + 3.0  # unnormalised logits
    logits_q = torch.log(torch.tensor(Q, dtype=torch.float64)) - 1.0
    logits_p, logits_q = logits_p.expand(2, 3, 4), logits_q.expand(2, 3, 4)
    full = kl_penalty(logits_p, logits_q, "full")
    assert full.shape == (2, 3)
    assert torch.allclose(full, torch.full((2, 3), EXACT_KL, dtype=torch.float64), atol=1e-12)
    log_probs = torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1)
    assert torch.allclose(kl_penalty(*log_probs, "full"), full, atol=1e-12)
    with pytest.raises(ValueError, match="over the vocabulary"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), "full")
    with pytest.raises(ValueError, match="unknown kl_penalty 'k4'"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), "k4")


def test_entropy_from_logits_matches_definition():
    logits = torch.randn(3, 4, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    entropy = compute_entropy_from_logits(logits)
    probs = torch.softmax(logits, -1)
    for idx in [(0, 0), (1, 2), (2, 3)]:
        expected = -sum(p * math.log(p) for p in probs[idx].tolist())
        assert entropy[idx].item() == pytest.approx(expected, rel=1e-10)
    assert compute_entropy_from_logits(torch.zeros(5)).item() == pytest.approx(math.log(5))


def test_adaptive_controller_follows_ziegler_update():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=100)
    coef = 0.1
    for current_kl, n_steps in [(0.06, 10), (1.0, 10), (0.0, 20), (0.05, 5), (0.04, 100)]:
        ctrl.update(current_kl=current_kl, n_steps=n_steps)
        error = min(max(current_kl / 0.05 - 1, -0.2), 0.2)
        coef *= 1 + error * n_steps / 100
        assert ctrl.value == pytest.approx(coef, rel=1e-12)
    assert coef != pytest.approx(0.1)
    with pytest.raises(ValueError, match="horizon > 0"):
        AdaptiveKLController(0.1, 0.05, 0)


def test_fixed_controller_and_factory():
    fixed = get_kl_controller(KLControlConfig(type="fixed", kl_coef=0.02))
    fixed.update(current_kl=5.0, n_steps=100)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.02
    adaptive = get_kl_controller(KLControlConfig(type="adaptive", kl_coef=0.3, target_kl=0.1, horizon=50))
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.3, 0.1, 50)
    with pytest.raises(ValueError, match="unknown algorithm.kl_ctrl.type 'pid'"):
        get_kl_controller(KLControlConfig(type="pid"))


def test_apply_kl_penalty_masks_and_updates_controller(batch_mask):
    gen = torch.Generator().manual_seed(2)
    scores = torch.zeros(batch_mask.shape)
    scores[:, 0] = 1.0
    old_lp = -torch.rand(batch_mask.shape, generator=gen)
    ref_lp = -torch.rand(batch_mask.shape, generator=gen)
    ctrl = AdaptiveKLController(init_kl_coef=0.5, target_kl=0.01, horizon=60)
    rewards, metrics = apply_kl_penalty(scores, old_lp, ref_lp, batch_mask, ctrl, "kl")
    kl = (old_lp - ref_lp) * batch_mask
    assert torch.allclose(rewards, scores - 0.5 * kl)
    assert torch.equal(rewards[batch_mask == 0], scores[batch_mask == 0])  # no KL off the mask
    row_means = [sum(kl[i].tolist()) / batch_mask[i].sum().item() for i in range(batch_mask.shape[0])]
    current_kl = sum(row_means) / len(row_means)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(current_kl, rel=1e-5)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    error = min(max(current_kl / 0.01 - 1, -0.2), 0.2)
    assert ctrl.value == pytest.approx(0.5 * (1 + error * batch_mask.shape[0] / 60), rel=1e-5)
