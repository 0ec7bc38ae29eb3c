"""LLDS (Deng et al. 2026, arXiv:2512.04220) against a loop written from its equation."""

import pytest
import torch

from tests.algos.conftest import multi_turn_mask
from verl.algorithms import agg_loss, compute_llds_loss
from verl.algorithms.llds import action_segments


def llds_reference(old, new, adv, mask, gate):
    """Per-token penalty of L_LLDS: 1[A >= 0] * 1[sum of (old - new) over the token's action (or
    response) > 0] * max(0, old - new); actions are the runs of preserved model tokens."""
    out = []
    for o_row, n_row, a_row, m_row in zip(old, new, adv, mask):
        keep = [bool(m) and a >= 0 for m, a in zip(m_row, a_row)]
        runs, current = [], []
        for t, k in enumerate(keep):
            if k:
                current.append(t)
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        if gate == "response":
            runs = [[t for run in runs for t in run]] if runs else []
        row = [0.0] * len(m_row)
        for run in runs:
            if sum(o_row[t] - n_row[t] for t in run) > 0:
                for t in run:
                    row[t] = max(0.0, o_row[t] - n_row[t])
        out.append(row)
    return out


@pytest.mark.parametrize("gate", ["action", "response"])
def test_llds_matches_equation(gate):
    mask = multi_turn_mask(8, 12, seed=11).double()
    gen = torch.Generator().manual_seed(12)
    old = -torch.rand(mask.shape, generator=gen, dtype=torch.float64) * 3
    new = old + 0.5 * torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    adv = torch.randn(mask.shape[0], 1, generator=gen, dtype=torch.float64).expand_as(mask).clone()
    loss, metrics = compute_llds_loss(old, new, adv, mask, gate=gate)
    penalty = torch.tensor(llds_reference(old.tolist(), new.tolist(), adv.tolist(), mask.tolist(), gate),
                           dtype=torch.float64)
    assert loss.item() == pytest.approx(agg_loss(penalty, mask, "token-mean").item(), abs=1e-12)
    assert metrics["actor/llds_active_tokens"].item() == pytest.approx(((penalty > 0).sum() / mask.sum()).item())


def test_llds_gates_on_the_action_not_the_response():
    """Row 0: the first action lost likelihood (net), the second gained it: only the first action's
    displaced token is penalised with the action gate; the response gate sees the net gain (0)."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]])
    old = torch.tensor([[-1.0, -1.0, 0.0, -1.0, -1.0]])
    new = torch.tensor([[-1.5, -0.8, 0.0, -0.2, -0.2]])  # action 1 fell by 0.5 - 0.2 net; action 2 rose by 1.6
    adv = torch.ones_like(mask)
    action, _ = compute_llds_loss(old, new, adv, mask, gate="action")
    response, _ = compute_llds_loss(old, new, adv, mask, gate="response")
    assert action.item() == pytest.approx(0.5 / 4)
    assert response.item() == 0.0


def test_llds_skips_negative_advantages_and_is_zero_before_any_update():
    mask = torch.ones(2, 3)
    old = torch.full((2, 3), -1.0)
    new = torch.full((2, 3), -2.0)
    adv = torch.tensor([[-1.0] * 3, [0.0] * 3])  # row 0 should become less likely: never regularised
    loss, _ = compute_llds_loss(old, new, adv, mask)
    assert loss.item() == pytest.approx(3 * 1.0 / 6)
    same, metrics = compute_llds_loss(old, old.clone(), adv, mask)
    assert same.item() == 0.0 and metrics["actor/llds_active_tokens"].item() == 0.0


def test_llds_gradient_raises_only_the_displaced_tokens():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0, 0.0]])
    new = torch.tensor([[-2.0, -0.5, -1.2, 0.0]], requires_grad=True)  # net -0.7: the action is gated
    loss, _ = compute_llds_loss(old, new, torch.ones_like(mask), mask)
    loss.backward()
    # d loss / d new = -1/3 on tokens that lost likelihood (0 and 2), 0 elsewhere: descent raises them
    assert torch.allclose(new.grad, torch.tensor([[-1 / 3, 0.0, -1 / 3, 0.0]]))


def test_llds_action_segments_are_runs_between_observations():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 1], [0, 1, 1, 1, 0, 0, 0]])
    assert action_segments(mask).tolist() == [[1, 1, 0, 0, 2, 0, 3], [0, 1, 1, 1, 0, 0, 0]]
    with pytest.raises(ValueError, match="gate must be one of"):
        compute_llds_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), gate="token")
