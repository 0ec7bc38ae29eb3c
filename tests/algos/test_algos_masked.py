"""masked_mean / masked_var / masked_whiten and every loss_agg_mode against plain loops."""

import pytest
import torch

from tests.algos.reference import mean, unbiased_var, whiten
from verl.trainer.ppo.core_algos import LOSS_AGG_MODES, agg_loss, masked_mean, masked_var, masked_whiten


def test_masked_mean_var_match_loops(batch_mask):
    x = torch.randn(batch_mask.shape, dtype=torch.float64)
    valid = [x[i, t].item() for i in range(x.shape[0]) for t in range(x.shape[1]) if batch_mask[i, t]]
    assert masked_mean(x, batch_mask).item() == pytest.approx(mean(valid), rel=1e-12)
    assert masked_var(x, batch_mask).item() == pytest.approx(unbiased_var(valid), rel=1e-12)
    for i in range(x.shape[0]):
        row = [x[i, t].item() for t in range(x.shape[1]) if batch_mask[i, t]]
        assert masked_mean(x, batch_mask, dim=-1)[i].item() == pytest.approx(mean(row), rel=1e-12)


def test_masked_mean_ignores_masked_values_and_empty_rows():
    x = torch.tensor([[1.0, 2.0, float("1e30")], [5.0, 6.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.equal(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 0.0]))
    assert masked_mean(x, mask).item() == 1.5


def test_masked_var_rejects_too_few_elements():
    with pytest.raises(ValueError, match="sum\\(mask\\) == 0"):
        masked_var(torch.ones(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(torch.ones(2, 2), torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


def test_masked_whiten_matches_loop_and_shift_mean(batch_mask):
    x = torch.randn(batch_mask.shape, dtype=torch.float64) * 3 + 2
    expected = whiten(x.tolist(), batch_mask.tolist())
    got = masked_whiten(x, batch_mask) * batch_mask
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), atol=1e-10)
    no_shift = masked_whiten(x, batch_mask, shift_mean=False)
    assert torch.allclose(no_shift - masked_whiten(x, batch_mask), masked_mean(x, batch_mask).expand_as(x))


def _agg_reference(loss, mask, mode):
    rows = [[l for l, m in zip(lr, mr) if m] for lr, mr in zip(loss, mask)]
    if mode == "token-mean":
        flat = [l for row in rows for l in row]
        return sum(flat) / len(flat)
    if mode == "seq-mean-token-sum":
        return mean([sum(row) for row in rows])
    if mode == "seq-mean-token-mean":
        return mean([sum(row) / len(row) if row else 0.0 for row in rows])
    if mode == "seq-mean-token-sum-norm":
        return sum(sum(row) for row in rows) / len(mask[0])
    raise AssertionError(mode)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_modes_match_loops(batch_mask, mode):
    loss = torch.randn(batch_mask.shape, dtype=torch.float64)
    mask = batch_mask.clone()
    mask[2] = 0.0  # a row without any action token
    expected = _agg_reference(loss.tolist(), mask.tolist(), mode)
    assert agg_loss(loss, mask, mode).item() == pytest.approx(expected, rel=1e-12)


def test_agg_loss_modes_differ_and_unknown_raises(batch_mask):
    loss = torch.rand(batch_mask.shape) + 0.5
    values = {mode: agg_loss(loss, batch_mask, mode).item() for mode in LOSS_AGG_MODES}
    assert len(set(round(v, 6) for v in values.values())) == len(LOSS_AGG_MODES)
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'token-sum'"):
        agg_loss(loss, batch_mask, "token-sum")
