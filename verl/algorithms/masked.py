"""Masked statistics and loss aggregation over (batch, response_len) tensors.

Every RL quantity lives on response tokens, and only some of them are actions: observation
tokens (retrieved ``<information>`` text) and right padding carry ``response_mask == 0``. These
helpers are the single place where the mask enters a mean, a variance or a loss, so that masked
tokens contribute nothing (and receive exactly zero gradient: they are multiplied by 0).
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x * mask`` over ``dim`` (all elements when ``dim`` is None)."""
    product = x * mask
    return product.sum() if dim is None else product.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is 1.

    Args:
        x: any shape, e.g. ``(batch, response_len)``.
        mask: same shape as ``x``, 0/1 (float or bool).
        dim: reduce over this dimension; None reduces over all elements (scalar result).

    Returns:
        ``sum(x * mask) / sum(mask)``; 0 where the mask is empty (never NaN).
    """
    mask = mask.to(x.dtype)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    # clamp only affects empty masks (numerator is then 0 too): result 0 instead of NaN
    return masked_sum(x, mask, dim) / count.clamp_min(1e-8)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all positions where ``mask`` is 1 (scalar).

    Args:
        x, mask: same shape, mask 0/1.
        unbiased: apply Bessel's correction ``n / (n - 1)`` (as veRL's ``masked_var``).

    Raises:
        ValueError: the mask is empty, or has a single element while ``unbiased`` is set.
    """
    mask = mask.to(x.dtype)
    mean = masked_mean(x, mask)
    variance = masked_mean((x - mean) ** 2, mask)
    count = mask.sum()
    if count == 0:
        raise ValueError("masked_var: mask has no valid element (sum(mask) == 0)")
    if unbiased:
        if count == 1:
            raise ValueError("masked_var: unbiased variance needs at least 2 masked elements, got 1")
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Whiten ``x`` with the mean and (unbiased) variance over the masked positions.

    Returns ``(x - mean) / sqrt(var + 1e-8)``; with ``shift_mean=False`` the mean is added back
    (only the scale changes). Values at masked-out positions are transformed too but are
    meaningless: callers multiply by the mask afterwards. Same shape as ``x``.

    Raises:
        ValueError: fewer than 2 valid elements (see :func:`masked_var`).
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Aggregate a per-token loss ``(batch, response_len)`` into a scalar (veRL semantics).

    Modes (``m`` = loss_mask, ``L`` = loss_mat, ``B`` rows, ``R`` = response_len):

    - ``token-mean``: ``sum(L*m) / sum(m)``; every token weighs the same (DAPO).
    - ``seq-mean-token-sum``: ``mean_b sum_t L*m``; mean over all rows of per-row sums.
    - ``seq-mean-token-mean``: ``mean_b (sum_t L*m / sum_t m)``; each row weighs the same
      (original GRPO); a row with no valid token contributes 0 (veRL would give NaN).
    - ``seq-mean-token-sum-norm``: ``sum_b sum_t L*m / R``; a constant normaliser
      (Dr. GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training"); as in veRL the
      divisor is ``R`` (keep ``max_response_length`` fixed so it stays constant).

    Raises:
        ValueError: unknown ``loss_agg_mode``.
    """
    loss_mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    seq_sums = masked_sum(loss_mat, loss_mask, dim=-1)
    if loss_agg_mode == "seq-mean-token-sum":
        return seq_sums.mean()
    if loss_agg_mode == "seq-mean-token-mean":
        return (seq_sums / loss_mask.sum(dim=-1).clamp_min(1.0)).mean()
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return seq_sums.sum() / loss_mask.shape[-1]
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {list(LOSS_AGG_MODES)}")
