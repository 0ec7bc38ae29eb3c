"""REINFORCE (Williams 1992, baseline 0): the advantage of an action token is its return-to-go."""

import pytest
import torch

from tests.algos.conftest import multi_turn_mask
from tests.algos.reference import action_positions, credited_rewards
from verl.algorithms import get_adv_estimator


def reinforce_reference(rewards, mask, gamma):
    """G_t = sum_{j >= k} gamma^(j - k) r_{t_j} over a row's action tokens t_0 < t_1 < ...."""
    out = []
    for r_row, m_row in zip(rewards, mask):
        r_row = credited_rewards(r_row, m_row)
        steps, row = action_positions(m_row), [0.0] * len(m_row)
        for k, t in enumerate(steps):
            row[t] = sum(gamma ** (j - k) * r_row[steps[j]] for j in range(k, len(steps)))
        out.append(row)
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_advantage_is_the_return_to_go(gamma):
    mask = multi_turn_mask(6, 10, seed=5).double()
    gen = torch.Generator().manual_seed(6)
    rewards = torch.randn(mask.shape, generator=gen, dtype=torch.float64) * mask
    adv, ret = get_adv_estimator("reinforce").fn(rewards, mask, gamma=gamma)
    expected = torch.tensor(reinforce_reference(rewards.tolist(), mask.tolist(), gamma), dtype=torch.float64)
    assert torch.allclose(adv, expected, atol=1e-12)
    assert torch.equal(adv, ret)


def test_reinforce_outcome_score_on_every_action_token_without_baseline():
    """An outcome score (on the last real token) reaches every action token of its row unchanged:
    no critic, no group mean, no whitening (negative scores stay negative, equal scores equal)."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.8, 0.0], [0.0, 0.0, -0.2, 0.0, 0.0, 0.0]])
    adv, _ = get_adv_estimator("reinforce").fn(rewards, mask)
    assert torch.equal(adv, torch.tensor([[0.8, 0.8, 0.0, 0.0, 0.8, 0.0], [-0.2, -0.2, -0.2, 0.0, 0.0, 0.0]]))
    entry = get_adv_estimator("reinforce")
    assert not entry.needs_critic and not entry.needs_groups
