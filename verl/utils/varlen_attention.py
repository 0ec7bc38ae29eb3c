"""Packed-sequence attention through torch's variable-length flash kernel.

``attn_implementation="torch_varlen"`` (registered with transformers on import of this module)
runs attention over packed rows with :func:`torch.nn.attention.varlen.varlen_attn`: every
sequence of a packed row attends causally to itself only, and no work goes to the other
sequences of the row. The sdpa path instead builds a dense block-diagonal ``(L, L)`` mask per
packed row and its kernel computes every masked-out block (``O(L^2)`` per row), which is why sdpa
rows are capped at ``max_packed_row_len``; with this kernel a micro-batch can be one long row.

Sequence boundaries come from ``position_ids``: a packed sequence starts where its position is 0
(the layout of :func:`verl.utils.torch_functional.pack_sequences_rows`, whose row filler also
starts at 0). The caller computes them once per forward (:func:`boundary_kwargs`) and passes them
with the model's inputs, as transformers' flash-attention kwargs ``cu_seq_lens_q`` /
``max_length_q``, so no layer repeats the host sync; without them each call derives its own. This
kernel needs no ``flash_attn`` package (torch >= 2.10 ships it). :func:`register` makes the name
known to transformers; the model loader calls it when the name is requested.

Fallbacks (same results, no varlen kernel): a padded batch (2D mask with zeros) or a KV-cache step
goes to transformers' sdpa; on CPU, or in fp32, each sequence runs through sdpa on its own.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F

NAME = "torch_varlen"

def varlen_kernel_available() -> bool:
    """Whether :func:`torch.nn.attention.varlen.varlen_attn` exists and a CUDA device is present."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def packed_row_len(model: torch.nn.Module, max_packed_row_len: int, total_tokens: int) -> int:
    """Token budget of one packed row: the cap (0: none) unless the model runs torch_varlen attention.

    The cap exists to bound sdpa's dense ``O(L^2)`` block-diagonal mask; the varlen kernel has no
    such cost, so a micro-batch becomes one row (bigger matmuls, no row filler).
    """
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME:
        return total_tokens
    return max_packed_row_len or total_tokens


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Cumulative sequence starts of the packed ``position_ids`` ``(B, L)``, flattened row-major.

    Returns:
        ``cu_seqlens`` ``(N + 1,)`` int32 (``N`` sequences, last entry ``B * L``) and the longest
        sequence's length (one host sync).
    Raises:
        ValueError: the first position is not 0 (a row would start mid-sequence).
    """
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("torch_varlen attention needs packed position_ids whose sequences start at position 0; "
                         f"got first positions {flat[:8].tolist()}")
    cu = torch.cat([starts, starts.new_tensor([flat.numel()])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def boundary_kwargs(position_ids: torch.Tensor) -> dict:
    """The sequence boundaries of a packed forward as model keyword arguments (computed once)."""
    cu, max_len = cu_seqlens_from_position_ids(position_ids)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max_len, "max_length_k": max_len}


@functools.cache
def _kernel() -> tuple:
    """``(varlen_attn, causal kwargs, takes enable_gqa)``, read once from the installed torch.

    torch 2.10 spells causality ``is_causal=True``; 2.11+ ``window_size=(-1, 0)``.
    """
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    return varlen_attn, causal, "enable_gqa" in params


def _flash_varlen(query, key, value, cu, max_len: int, scaling) -> torch.Tensor:
    """``(T, H, D)`` tensors through the CUDA kernel; grouped KV heads repeated if it lacks GQA."""
    varlen_attn, causal, takes_gqa = _kernel()
    if key.shape[1] != query.shape[1]:
        if takes_gqa:
            causal = {**causal, "enable_gqa": True}
        else:
            groups = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return varlen_attn(query, key, value, cu, cu, max_len, max_len, scale=scaling, **causal)


def _reference_varlen(query, key, value, cu, scaling) -> torch.Tensor:
    """The same attention one sequence at a time with sdpa: ``(T, H, D)`` in and out (CPU / fp32)."""
    groups = query.shape[1] // key.shape[1]
    out = torch.empty_like(query)
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))  # (H, S, D)
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
        out[start:end] = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling).transpose(0, 1)
    return out


def varlen_attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, scaling: float | None = None,
                             dropout: float = 0.0, **kwargs):
    """transformers attention function: ``query`` ``(B, H, S, D)``, ``key``/``value`` ``(B, H_kv, S, D)``.

    Boundaries come from ``kwargs["cu_seq_lens_q"]`` / ``["max_length_q"]`` (:func:`boundary_kwargs`)
    or, without them, from ``kwargs["position_ids"]``. Returns ``(attn_output (B, S, H, D), None)``
    as transformers' attention functions do.
    Raises:
        ValueError: dropout is requested (the policy's forward never uses it) or positions are
            missing/malformed (see :func:`cu_seqlens_from_position_ids`).
    """
    position_ids = kwargs.get("position_ids")
    if attention_mask is not None or key.shape[2] != query.shape[2] or position_ids is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      dropout=dropout, **kwargs)
    if dropout:
        raise ValueError(f"torch_varlen attention does not implement dropout (got {dropout})")
    batch, heads, seqlen, head_dim = query.shape
    if kwargs.get("cu_seq_lens_q") is not None:
        cu, max_len = kwargs["cu_seq_lens_q"], int(kwargs["max_length_q"])
    else:
        cu, max_len = cu_seqlens_from_position_ids(position_ids.expand(batch, seqlen))
    q, k, v = (t.transpose(1, 2).reshape(batch * seqlen, t.shape[1], head_dim) for t in (query, key, value))
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        out = _flash_varlen(q, k, v, cu, max_len, scaling)
    else:
        out = _reference_varlen(q, k, v, cu, scaling)
    return out.view(batch, seqlen, heads, head_dim), None


def varlen_attention_mask(*args, attention_mask: torch.Tensor | None = None, **kwargs):
    """Mask builder: none for packed or unpadded input (boundaries come from positions), sdpa's otherwise."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register() -> None:
    """Make ``attn_implementation="torch_varlen"`` known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, varlen_attention_forward)
    AttentionMaskInterface.register(NAME, varlen_attention_mask)
