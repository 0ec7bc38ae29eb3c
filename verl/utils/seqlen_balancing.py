"""Dynamic micro-batching: split rows into micro-batches under a token budget.

With ``use_dynamic_bsz`` the actor and critic group rows so that each micro-batch holds at most
``max_token_len`` valid tokens (sum of ``attention_mask``), instead of a fixed number of rows. Rows
of very different lengths then cost about the same per micro-batch, which evens out memory and
time. The partition is balanced (longest-first greedy into the currently lightest bin) and the
caller restores the original row order with :func:`restore_order`.
"""

from __future__ import annotations

import heapq
import math

import torch


def balanced_partition(seqlens: list[int], num_bins: int) -> list[list[int]]:
    """Split row indices into ``num_bins`` groups with near-equal total length.

    Longest-processing-time-first greedy (Graham 1969): each row, longest first, goes to the bin
    with the smallest current sum. Empty bins are dropped.

    Returns:
        Lists of row indices; each list is sorted ascending.
    """
    heap = [(0, b) for b in range(num_bins)]
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    for idx in sorted(range(len(seqlens)), key=lambda i: (-seqlens[i], i)):
        total, b = heapq.heappop(heap)
        bins[b].append(idx)
        heapq.heappush(heap, (total + seqlens[idx], b))
    return [sorted(b) for b in bins if b]


def rearrange_micro_batches(seqlens: torch.Tensor | list[int], max_token_len: int,
                            min_num_micro_batches: int = 1) -> list[list[int]]:
    """Partition rows into the fewest balanced micro-batches that each fit ``max_token_len`` tokens.

    Args:
        seqlens: ``(B,)`` valid tokens per row.
        max_token_len: token budget of one micro-batch (per GPU).
        min_num_micro_batches: lower bound on the count (e.g. to keep ranks in step).
    Returns:
        A list of index lists (ascending within each); every row appears exactly once.
    Raises:
        ValueError: one row alone exceeds the budget.
    """
    lens = [int(x) for x in (seqlens.tolist() if torch.is_tensor(seqlens) else seqlens)]
    if not lens:
        return []
    longest = max(lens)
    if longest > max_token_len:
        raise ValueError(f"a row has {longest} tokens, more than ppo_max_token_len_per_gpu={max_token_len}; "
                         "raise the budget to at least the longest sequence")
    num_bins = max(min_num_micro_batches, math.ceil(sum(lens) / max_token_len))
    while True:
        bins = balanced_partition(lens, min(num_bins, len(lens)))
        if all(sum(lens[i] for i in b) <= max_token_len for b in bins):
            return bins
        num_bins += 1


def restore_order(chunks: list[torch.Tensor], partitions: list[list[int]]) -> torch.Tensor:
    """Concatenate per-micro-batch outputs and put rows back in their original order.

    Args:
        chunks: outputs ``(len(partition), ...)`` per micro-batch, in partition order.
        partitions: the index lists returned by :func:`rearrange_micro_batches`.
    Returns:
        ``(B, ...)`` with row ``i`` at index ``i``.
    """
    order = torch.tensor([i for part in partitions for i in part], dtype=torch.long)
    stacked = torch.cat(chunks, dim=0)
    out = torch.empty_like(stacked)
    out[order] = stacked
    return out


def split_micro_batches(batch, micro_batch_size: int | None = None, max_token_len: int | None = None,
                        group=None) -> tuple[list, list[list[int]]]:
    """Split a TensorDict of B rows into micro-batches, by row count or by token budget.

    Args:
        batch: ``TensorDict`` with ``attention_mask`` ``(B, T)``.
        micro_batch_size: rows per micro-batch (fixed mode).
        max_token_len: token budget per micro-batch (dynamic mode, wins when both are given).
        group: process group whose ranks must run the same number of micro-batches (FSDP
            collectives run per forward); the count is the max over ranks. ``None``: the default
            group when initialised.
    Returns:
        ``(micro_batches, partitions)``: the micro-batches and, per micro-batch, the original row
        indices (use :func:`restore_order` to put per-row outputs back).
    Raises:
        ValueError: neither size is given.
    """
    num_rows = int(batch.batch_size[0])
    if max_token_len:
        seqlens = batch["attention_mask"].sum(-1)
        count = math.ceil(int(seqlens.sum()) / max_token_len)
        count = _max_over_ranks(max(count, 1), group)
        partitions = rearrange_micro_batches(seqlens, max_token_len, min_num_micro_batches=count)
    elif micro_batch_size:
        partitions = [list(range(s, min(s + micro_batch_size, num_rows))) for s in range(0, num_rows, micro_batch_size)]
    else:
        raise ValueError("set ppo_micro_batch_size_per_gpu (fixed micro-batches) or use_dynamic_bsz with "
                         "ppo_max_token_len_per_gpu")
    return [batch[torch.tensor(p, dtype=torch.long)] for p in partitions], partitions


def _max_over_ranks(value: int, group=None) -> int:
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())


def grad_accum_weights(masks: list[torch.Tensor], loss_agg_mode: str, group=None) -> list[float]:
    """Per-micro-batch loss multipliers so accumulated gradients equal one global mini-batch step.

    Each micro-batch loss is ``agg_loss`` over its own rows; FSDP averages gradients over the
    ``W`` ranks. Multiplying micro-batch ``i`` by ``w_i`` makes the sum equal ``agg_loss`` over the
    whole mini-batch of all ranks:

    * ``token-mean``: ``w_i = W * tokens_i / tokens_total`` (tokens summed over ranks);
    * ``seq-mean-token-sum``, ``seq-mean-token-mean``: ``w_i = rows_i / rows_rank`` (every rank
      holds the same number of rows);
    * ``seq-mean-token-sum-norm``: ``w_i = W`` (the mode sums over rows, then divides by a constant).

    Args:
        masks: ``response_mask`` ``(rows_i, R)`` of each micro-batch of this rank's mini-batch.
    Raises:
        ValueError: unknown ``loss_agg_mode``.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if loss_agg_mode == "token-mean":
        # one device-to-host copy for all micro-batches, not one per micro-batch
        tokens = torch.stack([m.sum().double() for m in masks]).cpu() if masks else torch.zeros(0, dtype=torch.float64)
        total = tokens.sum().reshape(1)
        if world > 1:
            dist.all_reduce(total, group=group)
        return (world * tokens / total.clamp_min(1.0)).tolist()
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        rows = sum(m.shape[0] for m in masks)
        return [m.shape[0] / rows for m in masks]
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return [float(world)] * len(masks)
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}")
