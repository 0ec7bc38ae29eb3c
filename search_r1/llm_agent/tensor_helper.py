"""Pack per-row token lists into the padded tensors of the rollout DataProto."""

from __future__ import annotations

from typing import Sequence

import torch


def pad_rows(rows: Sequence[Sequence], width: int, pad_value, dtype: torch.dtype, left: bool) -> torch.Tensor:
    """Stack ragged rows into ``(len(rows), width)``, padding on the left or the right.

    Raises:
        ValueError: a row longer than ``width`` (names the row).
    """
    out = torch.full((len(rows), width), pad_value, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"row {i} has {len(row)} items, more than the width {width}")
        if not row:
            continue
        values = torch.tensor(list(row), dtype=dtype)
        if left:
            out[i, width - len(row):] = values
        else:
            out[i, :len(row)] = values
    return out


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``cumsum(attention_mask) - 1`` clipped at 0, ``(batch, seq_len)`` int64."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
