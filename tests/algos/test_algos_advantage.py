"""Advantage estimators against loops written from their papers' equations."""

import math

import numpy as np
import pytest
import torch

from tests.algos.conftest import multi_turn_mask
from tests.algos.reference import action_positions, credited_rewards, mean, whiten
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    compute_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)

UIDS = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)  # "c" is a single-member group


def outcome_rewards(mask: torch.Tensor, seed: int) -> torch.Tensor:
    """Score on the last action token of each row (as the reward manager places it)."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.zeros(mask.shape, dtype=torch.float64)
    for row in range(mask.shape[0]):
        last = action_positions(mask[row].tolist())[-1]
        rewards[row, last] = float(torch.randint(0, 3, (1,), generator=gen))
    return rewards


def gae_reference(rewards, values, mask, gamma, lam):
    """Schulman et al. 2016 eq. 16 over each row's action tokens (observations skipped)."""
    adv, ret = [], []
    for r_row, v_row, m_row in zip(rewards, values, mask):
        r_row = credited_rewards(r_row, m_row)
        steps = action_positions(m_row)
        a_row, g_row = [0.0] * len(m_row), [0.0] * len(m_row)
        next_adv, next_value = 0.0, 0.0
        for t in reversed(steps):
            delta = r_row[t] + gamma * next_value - v_row[t]
            next_adv = delta + gamma * lam * next_adv
            next_value = v_row[t]
            a_row[t], g_row[t] = next_adv, next_adv + v_row[t]
        adv.append(a_row)
        ret.append(g_row)
    return whiten(adv, mask), ret


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_recursion(gamma, lam):
    mask = multi_turn_mask(6, 10, seed=1).double()
    rewards = torch.randn(mask.shape, dtype=torch.float64) * (torch.rand(mask.shape) < 0.3)
    values = torch.randn(mask.shape, dtype=torch.float64)
    adv, ret = get_adv_estimator_fn("gae")(rewards, mask, values=values, gamma=gamma, lam=lam)
    exp_adv, exp_ret = gae_reference(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    assert torch.allclose(adv, torch.tensor(exp_adv, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(ret, torch.tensor(exp_ret, dtype=torch.float64), atol=1e-10)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.999, 0.99), (0.7, 0.7)])
def test_gae_over_long_multi_turn_responses(gamma, lam):
    """Responses as long as a learning run's (1,500 tokens, several observation gaps) in float32, as
    the trainer passes them: the closed form (gamma * lam close to 1) and the loop it falls back to
    where gamma * lam ** 1,500 underflows (0.49 ** 1,499 ~ 1e-465) both give the recursion's values."""
    gen = torch.Generator().manual_seed(5)
    mask = torch.ones(4, 1500)
    for row, (gaps, end) in enumerate([(3, 1500), (1, 1200), (0, 900), (5, 1499)]):
        for _ in range(gaps):
            start = int(torch.randint(1, end - 60, (1,), generator=gen))
            mask[row, start:start + 50] = 0.0
        mask[row, end:] = 0.0
    rewards = outcome_rewards(mask, seed=6).float()
    values = torch.rand(mask.shape, generator=gen)
    adv, ret = get_adv_estimator_fn("gae")(rewards, mask, values=values, gamma=gamma, lam=lam)
    exp_adv, exp_ret = gae_reference(rewards.double().tolist(), values.double().tolist(), mask.tolist(), gamma, lam)
    assert adv.dtype == ret.dtype == torch.float32
    assert torch.allclose(ret.double(), torch.tensor(exp_ret, dtype=torch.float64), atol=1e-4)
    assert torch.allclose(adv.double(), torch.tensor(exp_adv, dtype=torch.float64), atol=1e-4)


def test_gae_right_padding_only_is_plain_recursion():
    """Without observation gaps the result is textbook GAE over positions 0..len-1."""
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.1, 9.0]])  # value at the pad position must not leak in
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    _, ret = get_adv_estimator_fn("gae")(rewards, mask, values=values, gamma=0.5, lam=0.5)
    d2 = 1.0 - 0.1
    d1 = 0.5 * 0.1 - 0.2
    d0 = 0.5 * 0.2 - 0.5
    a2, a1 = d2, d1 + 0.25 * d2
    a0 = d0 + 0.25 * a1
    assert torch.allclose(ret, torch.tensor([[a0 + 0.5, a1 + 0.2, a2 + 0.1, 0.0]]))


def test_gae_requires_values_and_matching_shapes(batch_mask):
    with pytest.raises(ValueError, match="gae needs values"):
        get_adv_estimator_fn("gae")(torch.zeros(batch_mask.shape), batch_mask)
    with pytest.raises(ValueError, match="shape mismatch"):
        get_adv_estimator_fn("gae")(torch.zeros(2, 3), torch.ones(2, 3), values=torch.zeros(2, 4))


def group_reference(scores, uids, norm_by_std, eps, leave_one_out=False):
    """GRPO (Shao et al. 2024) / RLOO (Ahmadian et al. 2024) per-row advantages."""
    out = []
    for i, s in enumerate(scores):
        group = [scores[j] for j in range(len(scores)) if uids[j] == uids[i]]
        if len(group) < 2 or max(group) == min(group):
            out.append(0.0)
        elif leave_one_out:
            others = [scores[j] for j in range(len(scores)) if uids[j] == uids[i] and j != i]
            out.append(s - mean(others))
        else:
            m = mean(group)
            std = math.sqrt(sum((g - m) ** 2 for g in group) / (len(group) - 1))
            out.append((s - m) / (std + eps) if norm_by_std else s - m)
    return out


def scores_with_mixed_groups(mask):
    rewards = torch.zeros(mask.shape, dtype=torch.float64)
    for row, score in enumerate([1.0, 0.0, 0.5, 2.0, -1.0, 3.0]):
        rewards[row, action_positions(mask[row].tolist())[-1]] = score
    return rewards


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_group_statistics(batch_mask, norm_by_std):
    mask = batch_mask.double()
    rewards = scores_with_mixed_groups(mask)
    adv, ret = get_adv_estimator_fn("grpo")(rewards, mask, index=UIDS, norm_adv_by_std_in_grpo=norm_by_std)
    expected = group_reference(rewards.sum(-1).tolist(), UIDS, norm_by_std, 1e-6)
    assert torch.allclose(adv, torch.tensor(expected, dtype=torch.float64)[:, None] * mask, atol=1e-9)
    assert torch.equal(adv, ret)
    assert torch.all(adv[5] == 0)  # single-member group


def test_rloo_matches_leave_one_out(batch_mask):
    mask = batch_mask.double()
    rewards = scores_with_mixed_groups(mask)
    adv, _ = get_adv_estimator_fn("rloo")(rewards, mask, index=UIDS)
    expected = group_reference(rewards.sum(-1).tolist(), UIDS, True, 0.0, leave_one_out=True)
    assert torch.allclose(adv, torch.tensor(expected, dtype=torch.float64)[:, None] * mask, atol=1e-12)


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_degenerate_groups_give_zero_not_nan(name):
    mask = torch.ones(5, 4)
    rewards = torch.zeros(5, 4)
    rewards[:, -1] = torch.tensor([0.1, 0.1, 0.1, 1.0, 7.0])  # equal group of 3, then two singletons
    uids = np.array(["x", "x", "x", "y", "z"], dtype=object)
    adv, ret = get_adv_estimator_fn(name)(rewards, mask, index=uids)
    assert torch.equal(adv, torch.zeros_like(adv))
    assert not torch.isnan(ret).any()


def test_group_estimators_need_index(batch_mask):
    with pytest.raises(ValueError, match="need index"):
        get_adv_estimator_fn("grpo")(torch.zeros(batch_mask.shape), batch_mask)
    with pytest.raises(ValueError, match="index has 2 entries but the batch has 6 rows"):
        get_adv_estimator_fn("rloo")(torch.zeros(batch_mask.shape), batch_mask, index=np.array([0, 1]))


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_discounted_returns(gamma):
    mask = multi_turn_mask(6, 10, seed=3).double()
    rewards = outcome_rewards(mask, seed=4) + 0.1 * torch.randn(mask.shape, dtype=torch.float64) * mask
    adv, ret = get_adv_estimator_fn("reinforce_plus_plus")(rewards, mask, gamma=gamma)
    expected_ret = []
    for r_row, m_row in zip(rewards.tolist(), mask.tolist()):
        row = [0.0] * len(m_row)
        steps = action_positions(m_row)
        for k, t in enumerate(steps):  # G_t = sum_{j >= k} gamma^(j-k) r_{t_j}
            row[t] = sum(gamma ** (j - k) * r_row[steps[j]] for j in range(k, len(steps)))
        expected_ret.append(row)
    assert torch.allclose(ret, torch.tensor(expected_ret, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(adv, torch.tensor(whiten(expected_ret, mask.tolist()), dtype=torch.float64), atol=1e-10)


def test_reinforce_plus_plus_baseline_matches_loop(batch_mask):
    mask = batch_mask.double()
    rewards = scores_with_mixed_groups(mask)
    adv, _ = get_adv_estimator_fn("reinforce_plus_plus_baseline")(rewards, mask, index=UIDS)
    scores = rewards.sum(-1).tolist()
    centred = [s - mean([scores[j] for j in range(6) if UIDS[j] == UIDS[i]]) for i, s in enumerate(scores)]
    tiled = [[c * m for m in m_row] for c, m_row in zip(centred, mask.tolist())]
    assert torch.allclose(adv, torch.tensor(whiten(tiled, mask.tolist()), dtype=torch.float64), atol=1e-10)


def test_reward_on_observation_token_is_credited_to_previous_action():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])  # truncated inside <information>
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    _, ret = get_adv_estimator_fn("reinforce_plus_plus")(rewards, mask, gamma=0.5)
    assert torch.equal(ret, torch.tensor([[0.5, 1.0, 0.0, 0.0]]))


def test_registry_lists_names_and_accepts_new_estimator(batch_mask):
    assert {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"} <= set(ADV_ESTIMATOR_REGISTRY)
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'.*'grpo'"):
        get_adv_estimator_fn("ppo")

    @register_adv_est("test_constant_one")
    def constant_one(token_level_rewards, response_mask, **kwargs):
        return response_mask.clone(), response_mask.clone()

    try:
        assert get_adv_estimator_fn("test_constant_one") is constant_one
        with pytest.raises(ValueError, match="already registered"):
            register_adv_est("test_constant_one")(lambda *a, **k: None)
    finally:
        ADV_ESTIMATOR_REGISTRY.pop("test_constant_one")


def test_compute_advantage_on_dataproto(batch_mask):
    rewards = scores_with_mixed_groups(batch_mask.double()).float()
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": batch_mask},
                               non_tensors={"uid": UIDS})
    compute_advantage(data, "grpo", norm_adv_by_std_in_grpo=True)
    expected, _ = get_adv_estimator_fn("grpo")(rewards, batch_mask, index=UIDS)
    assert torch.equal(data.batch["advantages"], expected)
    assert torch.equal(data.batch["returns"], expected)
