"""Truncated importance sampling weights between rollout and trainer log-probs."""

import math

import pytest
import torch

from verl.trainer.ppo.core_algos import compute_rollout_is_weights


def inputs(batch_mask):
    gen = torch.Generator().manual_seed(0)
    old_lp = -torch.rand(batch_mask.shape, dtype=torch.float64, generator=gen) * 3
    rollout_lp = old_lp + 0.6 * torch.randn(batch_mask.shape, dtype=torch.float64, generator=gen)
    return old_lp.requires_grad_(True), rollout_lp


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_token_level_weights_and_metrics(batch_mask, mode):
    old_lp, rollout_lp = inputs(batch_mask)
    weights, metrics = compute_rollout_is_weights(old_lp, rollout_lp, batch_mask, cap=1.5, level="token", mode=mode)
    assert not weights.requires_grad
    diffs, capped = [], 0
    for i in range(batch_mask.shape[0]):
        for t in range(batch_mask.shape[1]):
            if not batch_mask[i, t]:
                assert weights[i, t].item() == 0.0
                continue
            ratio = math.exp(old_lp[i, t].item() - rollout_lp[i, t].item())
            expected = min(ratio, 1.5) if mode == "truncate" else (ratio if ratio <= 1.5 else 0.0)
            assert weights[i, t].item() == pytest.approx(expected, rel=1e-12)
            diffs.append(abs(old_lp[i, t].item() - rollout_lp[i, t].item()))
            capped += ratio > 1.5
    assert 0 < capped < len(diffs)
    assert metrics["rollout_vs_actor_log_prob_diff"] == pytest.approx(sum(diffs) / len(diffs), rel=1e-12)
    assert metrics["rollout_vs_actor_log_prob_diff_max"] == pytest.approx(max(diffs), rel=1e-12)
    assert metrics["rollout_is_capped_ratio"] == pytest.approx(capped / len(diffs))


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_sequence_level_uses_product_of_token_ratios(batch_mask, mode):
    old_lp, rollout_lp = inputs(batch_mask)
    weights, _ = compute_rollout_is_weights(old_lp, rollout_lp, batch_mask, cap=2.0, level="sequence", mode=mode)
    for i in range(batch_mask.shape[0]):
        ratio = math.prod(math.exp(old_lp[i, t].item() - rollout_lp[i, t].item())
                          for t in range(batch_mask.shape[1]) if batch_mask[i, t])
        seq_weight = min(ratio, 2.0) if mode == "truncate" else (ratio if ratio <= 2.0 else 0.0)
        expected = torch.tensor([seq_weight], dtype=torch.float64) * batch_mask[i]
        assert torch.allclose(weights[i], expected.double(), rtol=1e-10)


def test_long_sequences_do_not_overflow():
    old_lp = torch.zeros(2, 2000)
    rollout_lp = torch.full((2, 2000), -1.0)  # ratio e^2000 per sequence
    mask = torch.ones(2, 2000)
    weights, metrics = compute_rollout_is_weights(old_lp, rollout_lp, mask, cap=2.0, level="sequence")
    assert torch.equal(weights, torch.full((2, 2000), 2.0))
    assert metrics["rollout_is_capped_ratio"] == 1.0
    dropped, _ = compute_rollout_is_weights(old_lp, rollout_lp, mask, cap=2.0, level="sequence", mode="mask")
    assert torch.equal(dropped, torch.zeros(2, 2000))


def test_bad_arguments_raise():
    x, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="cap must be > 0"):
        compute_rollout_is_weights(x, x, mask, cap=0.0)
    with pytest.raises(ValueError, match="level 'batch'"):
        compute_rollout_is_weights(x, x, mask, level="batch")
    with pytest.raises(ValueError, match="mode 'clip'"):
        compute_rollout_is_weights(x, x, mask, mode="clip")
    with pytest.raises(ValueError, match="shape mismatch"):
        compute_rollout_is_weights(x, torch.zeros(2, 4), mask)
