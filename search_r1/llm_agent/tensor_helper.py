"""Pack per-row token lists into the padded tensors of the rollout DataProto."""

from __future__ import annotations

from itertools import chain
from typing import Sequence

import numpy as np
import torch


def pad_rows(rows: Sequence[Sequence], width: int, pad_value, dtype: torch.dtype, left: bool) -> torch.Tensor:
    """Stack ragged rows into ``(len(rows), width)``, padding on the left or the right.

    All rows' values go into one array that is scattered through a mask (a tensor per row cost
    ~0.2 s for a 512-row rollout's seven outputs on the CPU).

    Raises:
        ValueError: a row longer than ``width`` (names the row).
    """
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    too_long = torch.nonzero(lengths > width).flatten()
    if too_long.numel():
        row = int(too_long[0])
        raise ValueError(f"row {row} has {int(lengths[row])} items, more than the width {width}")
    out = torch.full((len(rows), width), pad_value, dtype=dtype)
    if not rows:
        return out
    mask = length_mask(lengths, width, left).bool()
    values = np.fromiter(chain.from_iterable(rows), dtype=torch.empty(0, dtype=dtype).numpy().dtype,
                         count=int(lengths.sum()))
    out[mask] = torch.from_numpy(values)
    return out


def length_mask(lengths: torch.Tensor, width: int, left: bool) -> torch.Tensor:
    """``(len(lengths), width)`` int64: 1 on each row's first (right padding) or last (left padding)
    ``lengths[i]`` positions, 0 elsewhere."""
    columns = torch.arange(width)
    mask = columns >= width - lengths[:, None] if left else columns < lengths[:, None]
    return mask.long()


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``cumsum(attention_mask) - 1`` clipped at 0, ``(batch, seq_len)`` int64."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
