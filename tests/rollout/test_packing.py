"""Packing ragged per-row lists into the rollout's padded tensors."""

from __future__ import annotations

import pytest
import torch

from verl.workers.rollout.agent_loop.packing import length_mask, pad_rows


def reference(rows, width, pad, dtype, left):
    out = torch.full((len(rows), width), pad, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            values = torch.tensor(row, dtype=dtype)
            if left:
                out[i, width - len(row):] = values
            else:
                out[i, :len(row)] = values
    return out


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype,pad", [(torch.long, 7), (torch.float32, 0.0)])
def test_pad_rows_matches_row_by_row_padding(left, dtype, pad):
    rows = [[1, 2, 3], [], [4], [5, 6, 7, 8, 9]] if dtype == torch.long else [[0.5, -1.25], [], [3.0]]
    assert torch.equal(pad_rows(rows, 5, pad, dtype, left), reference(rows, 5, pad, dtype, left))


def test_pad_rows_edge_cases():
    assert pad_rows([], 4, 0, torch.long, left=False).shape == (0, 4)
    assert torch.equal(pad_rows([[], []], 3, 9, torch.long, left=True), torch.full((2, 3), 9))
    with pytest.raises(ValueError, match="row 1 has 4 items, more than the width 3"):
        pad_rows([[1], [1, 2, 3, 4]], 3, 0, torch.long, left=False)


def test_length_mask():
    lengths = torch.tensor([0, 2, 3])
    assert length_mask(lengths, 3, left=True).tolist() == [[0, 0, 0], [0, 1, 1], [1, 1, 1]]
    assert length_mask(lengths, 3, left=False).tolist() == [[0, 0, 0], [1, 1, 0], [1, 1, 1]]
