"""Shared inputs for the algorithm tests: small random batches with multi-turn style masks."""

import pytest
import torch


def multi_turn_mask(batch: int, length: int, seed: int) -> torch.Tensor:
    """0/1 mask (batch, length): action spans, an observation gap, right padding per row."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, length)
    for row in range(batch):
        end = int(torch.randint(2, length + 1, (1,), generator=gen))
        mask[row, :end] = 1.0
        if end >= 6:  # an <information> block in the middle of the response
            gap_start = int(torch.randint(1, end - 3, (1,), generator=gen))
            mask[row, gap_start:gap_start + 2] = 0.0
    return mask


@pytest.fixture
def batch_mask() -> torch.Tensor:
    return multi_turn_mask(batch=6, length=10, seed=0)
