"""Tensor helpers shared by the actor, the critic and the SFT trainer.

* log-probs and entropy from logits without materialising a full ``log_softmax`` copy where it is
  avoidable (``logsumexp`` then a gather);
* padding / unpadding: packing the valid tokens of a left/right padded batch into one row with
  per-sequence restarting ``position_ids`` (the "remove padding" path), and scattering per-token
  outputs back to the padded layout;
* the same statistics straight from the last hidden states, a chunk of tokens at a time
  (:func:`chunked_logprobs_entropy`), so ``(tokens, vocab)`` logits never exist at once;
* packing into several rows of bounded length (:func:`pack_sequences_rows`);
* masked reductions and one-sync metric conversion.

Shapes use B = rows, T = total (prompt + response) length, N = number of valid tokens in the batch.
"""

from __future__ import annotations

import functools

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``.

    Args:
        logits: ``(..., vocab)`` float tensor.
        labels: ``(...)`` integer tensor with the same leading shape.
    Returns:
        ``(...)`` float tensor ``log_softmax(logits)[..., labels]`` (nats).
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree on leading dims")
    logits = logits.float()
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``-sum_v p_v log p_v`` of ``softmax(logits)`` over the last dim, in nats.

    Uses ``H = logsumexp(z) - sum_v p_v z_v``, which avoids ``0 * log 0``.

    Args:
        logits: ``(..., vocab)``.
    Returns:
        ``(...)`` entropy.
    """
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1 (same shape)."""
    return (values * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1; 0 when the mask is empty."""
    return (values * mask).sum() / mask.sum().clamp_min(1)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``cumsum(attention_mask) - 1`` clipped at 0, shape ``(B, T)`` (the project's convention)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def unpad_input(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices of valid tokens and per-row lengths.

    Args:
        attention_mask: ``(B, T)``, 1 on real tokens.
    Returns:
        ``indices`` ``(N,)`` into the flattened ``(B*T,)`` batch, in row-major order, and
        ``seqlens`` ``(B,)`` number of valid tokens per row.
    """
    flat = attention_mask.reshape(-1).bool()
    indices = torch.nonzero(flat, as_tuple=False).squeeze(-1)
    return indices, attention_mask.long().sum(-1)


def pack_sequences(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack the valid tokens of every row into one ``(1, N)`` row.

    Hugging Face attention (sdpa, eager, flash-attention-2) treats a ``position_ids`` drop as a
    sequence boundary when no 2-D attention mask is given, so the packed forward equals the padded
    one while spending no compute on padding.

    Args:
        input_ids, attention_mask, position_ids: ``(B, T)``. Valid tokens of each row must be
            contiguous (left or right padding, not holes) and positions must start at 0 in each row.
    Returns:
        ``packed_ids`` ``(1, N)``, ``packed_position_ids`` ``(1, N)`` and ``indices`` ``(N,)``.
    Raises:
        ValueError: a row's valid positions do not start at 0 (packing would merge it with the
            previous row).
    """
    indices, _ = unpad_input(attention_mask)
    packed_ids = input_ids.reshape(-1)[indices].unsqueeze(0)
    packed_pos = position_ids.reshape(-1)[indices].unsqueeze(0)
    starts = attention_mask.long().argmax(-1)
    first_pos = position_ids.gather(1, starts.unsqueeze(1)).squeeze(1)
    bad = torch.nonzero((first_pos != 0) & (attention_mask.sum(-1) > 0)).flatten()
    if bad.numel():
        raise ValueError(f"rows {bad.tolist()} have position_ids not starting at 0; cannot pack them")
    return packed_ids, packed_pos, indices


def pad_packed(values: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int,
               fill: float = 0.0) -> torch.Tensor:
    """Scatter per-token ``values`` ``(N, ...)`` back to ``(batch, seqlen, ...)`` (``fill`` elsewhere)."""
    out = values.new_full((batch * seqlen, *values.shape[1:]), fill)
    out[indices] = values
    return out.reshape(batch, seqlen, *values.shape[1:])


def next_token_labels(input_ids: torch.Tensor) -> torch.Tensor:
    """Labels for next-token prediction: ``input_ids`` shifted left by one, last column repeated.

    The last column's label is meaningless (no next token); callers only read positions < T-1.
    """
    return torch.cat([input_ids[:, 1:], input_ids[:, -1:]], dim=1)


def response_slice(per_token: torch.Tensor, response_length: int) -> torch.Tensor:
    """Select the outputs that predict the response tokens.

    The token at position ``t`` is predicted by the output at ``t - 1``, so the response tokens
    (positions ``T-R .. T-1``) are predicted by outputs ``T-R-1 .. T-2``.

    Args:
        per_token: ``(B, T, ...)`` outputs aligned with the input positions.
        response_length: R.
    Returns:
        ``(B, R, ...)``.
    """
    seqlen = per_token.shape[1]
    return per_token[:, seqlen - response_length - 1: seqlen - 1]


def warmup_lr_lambda(total_steps: int, warmup_steps: int, style: str = "constant",
                     min_lr_ratio: float = 0.0):
    """Multiplier of the base lr per optimizer step: linear warmup, then constant or cosine.

    Warmup goes ``(step + 1) / warmup_steps`` so the first step already trains; cosine decays from 1
    to ``min_lr_ratio`` over the remaining ``total_steps - warmup_steps`` steps (Loshchilov & Hutter,
    SGDR, 2017).

    Raises:
        ValueError: unknown ``style`` or cosine without ``total_steps``.
    """
    if style not in ("constant", "cosine"):
        raise ValueError(f"learning-rate schedule must be 'constant' or 'cosine', got {style!r}")
    if style == "cosine" and total_steps <= 0:
        raise ValueError("optim.warmup_style=cosine needs a run of total_steps > 0 steps")

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if style == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return multiplier


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_config,
                       total_training_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR from an ``OptimConfig`` (``lr_warmup_steps_ratio`` of ``total_training_steps``,
    ``warmup_style`` constant|cosine, ``min_lr_ratio`` the cosine floor) over the run's length."""
    warmup = int(optim_config.lr_warmup_steps_ratio * total_training_steps)
    fn = warmup_lr_lambda(total_training_steps, warmup, optim_config.warmup_style, optim_config.min_lr_ratio or 0.0)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def build_optimizer(params, optim_config) -> torch.optim.AdamW:
    """AdamW from an ``OptimConfig`` (``lr``, ``weight_decay``, ``betas``, ``eps``).

    Raises:
        ValueError: ``lr`` is not positive.
    """
    if optim_config.lr <= 0:
        raise ValueError(f"optim.lr must be > 0, got {optim_config.lr}")
    return torch.optim.AdamW(params, lr=optim_config.lr, betas=tuple(optim_config.betas), eps=optim_config.eps,
                             weight_decay=optim_config.weight_decay)


def pack_sequences_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                        max_row_len: int, row_multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                           torch.Tensor]:
    """Pack the valid tokens of every row into ``k`` rows of at most ``max_row_len`` tokens.

    Like :func:`pack_sequences`, but sdpa/eager attention builds a dense block-diagonal mask over
    each packed row, costing ``O(row_len^2)``; several short packed rows keep that small while
    wasting little compute on padding. Rows are grouped with the balanced partition of
    :mod:`verl.utils.seqlen_balancing`; each packed row's tail is filled with a dummy sequence
    (token 0, positions ``0, 1, ...``) that attends only to itself and whose outputs are dropped.

    Args:
        input_ids, attention_mask, position_ids: ``(B, T)`` as for :func:`pack_sequences`.
        max_row_len: token budget of one packed row (raised to the longest row if that is longer).
        row_multiple: round the packed row length up to a multiple of this (fewer distinct shapes
            for compiled kernels such as flex attention; the extra slots are filler).
    Returns:
        ``packed_ids`` ``(k, L)``, ``packed_position_ids`` ``(k, L)``, ``src`` ``(N,)`` indices of
        the valid tokens in the flattened ``(B*T,)`` batch and ``dst`` ``(N,)`` their indices in the
        flattened ``(k*L,)`` packed batch (``src[i]`` sits at ``dst[i]``).
    Raises:
        ValueError: a row's valid positions do not start at 0.
    """
    from verl.utils.seqlen_balancing import rearrange_micro_batches

    _, flat_pos, _ = pack_sequences(input_ids, attention_mask, position_ids)  # validates positions
    del flat_pos
    seqlen = input_ids.shape[1]
    lens = attention_mask.long().sum(-1).tolist()
    starts = attention_mask.long().argmax(-1).tolist()
    groups = rearrange_micro_batches(lens, max(int(max_row_len), max(lens) if lens else 1))
    row_len = max(sum(lens[r] for r in g) for g in groups)
    row_len = -(-row_len // max(1, int(row_multiple))) * max(1, int(row_multiple))
    src, dst = [], []
    for k, group in enumerate(groups):
        offset = k * row_len
        for r in group:
            src.append(torch.arange(r * seqlen + starts[r], r * seqlen + starts[r] + lens[r]))
            dst.append(torch.arange(offset, offset + lens[r]))
            offset += lens[r]
    device = input_ids.device
    src, dst = torch.cat(src).to(device), torch.cat(dst).to(device)
    # Tail filler: positions restart at 0 after the last real token of each packed row.
    slot = torch.arange(len(groups) * row_len, device=device)
    used = torch.zeros_like(slot, dtype=torch.bool)
    used[dst] = True
    fill_start = slot - slot % row_len + used.view(len(groups), row_len).sum(-1).repeat_interleave(row_len)
    packed_pos = torch.where(used, slot, slot - fill_start).clone()
    packed_ids = torch.zeros_like(slot, dtype=input_ids.dtype)
    packed_ids[dst] = input_ids.reshape(-1)[src]
    packed_pos[dst] = position_ids.reshape(-1)[src].to(packed_pos.dtype)
    return packed_ids.view(len(groups), row_len), packed_pos.view(len(groups), row_len), src, dst


def _token_stats(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                 temperature: float, with_entropy: bool) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias).float() / temperature
    lse = torch.logsumexp(logits, dim=-1)
    stats = [torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1) - lse]
    if with_entropy:
        stats.append(lse - (torch.softmax(logits, dim=-1) * logits).sum(-1))
    return torch.stack(stats, dim=-1)


@functools.cache
def _compiled_token_stats():
    """``_token_stats`` through ``torch.compile``, compiled once per process on first use.

    Eager, each chunk makes ~20 passes over its ``(chunk, vocab)`` fp32 logits (cast, logsumexp,
    softmax, product, sum and their backward); compiled, these fuse into a few kernels. veRL's
    ``use_torch_compile`` compiles its entropy/log-prob functions for the same reason.
    """
    return torch.compile(_token_stats, dynamic=True)


def chunked_logprobs_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                             bias: torch.Tensor | None = None, temperature: float = 1.0, chunk_size: int = 4096,
                             calculate_entropy: bool = False, compiled: bool = False
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of ``labels`` under ``softmax((hidden @ weight.T + bias) / temperature)``.

    Never holds more than ``chunk_size`` tokens' logits: with a 152k vocabulary, fp32 logits of a
    16k-token micro-batch alone are 10 GB. Under autograd each chunk is checkpointed, so its logits
    are recomputed in backward instead of being kept.

    Args:
        hidden: ``(N, d)`` last hidden states (the LM head's input).
        weight: ``(V, d)`` LM head weight; ``bias`` ``(V,)`` or None.
        labels: ``(N,)`` target token ids.
        compiled: run each chunk's math through ``torch.compile`` (GPU; see ``_compiled_token_stats``).
    Returns:
        ``log_probs`` ``(N,)`` and ``entropy`` ``(N,)`` (or None), fp32, nats.
    """
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)} disagree on leading dims")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    stats_fn = _compiled_token_stats() if compiled else _token_stats
    chunks = []
    for start in range(0, hidden.shape[0], chunk_size):
        args = (hidden[start:start + chunk_size], weight, bias, labels[start:start + chunk_size],
                temperature, calculate_entropy)
        if needs_grad:
            chunks.append(torch.utils.checkpoint.checkpoint(stats_fn, *args, use_reentrant=False))
        else:
            chunks.append(stats_fn(*args))
    if not chunks:
        stats = hidden.new_zeros((0, 2 if calculate_entropy else 1), dtype=torch.float32)
    else:
        stats = torch.cat(chunks, dim=0)
    return stats[:, 0], (stats[:, 1] if calculate_entropy else None)


def metrics_to_floats(metrics: dict) -> dict[str, float]:
    """Python floats from a mix of floats and 0-d tensors, with a single device-to-host copy."""
    keys = [k for k, v in metrics.items() if torch.is_tensor(v)]
    out = {k: float(v) for k, v in metrics.items() if not torch.is_tensor(v)}
    if keys:
        values = torch.stack([metrics[k].detach().float().reshape(()) for k in keys]).cpu().tolist()
        out.update(zip(keys, values))
    return out
