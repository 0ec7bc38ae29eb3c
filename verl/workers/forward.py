"""The forward pass of every trained or frozen model: token log-probs (actor, reference) and values (critic).

One module owns how rows enter the model. :class:`ForwardLayout` is resolved once per model (from
its ``ModelConfig`` and the attention it was loaded with) and passed to every call:

* padded: ``model(input_ids, attention_mask, position_ids)`` on ``(B, T)``;
* ``use_remove_padding``: valid tokens of all rows packed into rows of at most
  ``max_packed_row_len`` tokens with per-sequence restarting ``position_ids`` and no attention mask;
  transformers then builds a block-diagonal causal mask (sdpa/eager) or runs varlen attention, so
  no compute goes to padding. With ``share_prompts`` (sdpa/eager only), rows with the same prompt
  share one copy of it under a custom mask (:mod:`verl.utils.prefix_sharing`), so a GRPO group's
  prompt is computed once;
* log-probs from the LM head's input, ``logits_chunk_size`` tokens at a time, so the full
  ``(B, T, V)`` logits never exist (:func:`verl.utils.torch_functional.chunked_logprobs_entropy`).

All layouts give the same numbers. Shapes: B rows, T = P + R (prompt left-padded to P, response
right-padded to R). Log-probs, entropies and values are 0 where the *target* response token is padding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from verl.utils import torch_functional as F
from verl.utils.prefix_sharing import pack_shared_prompts, supports_custom_mask
from verl.utils import varlen_attention
from verl.utils.varlen_attention import packed_row_len

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForwardLayout:
    """How a model's forward pass lays out its rows (same numbers in every layout).

    Args:
        use_remove_padding: pack valid tokens instead of running padded rows.
        max_packed_row_len: tokens per packed row (0: one row per micro-batch); ignored under
            ``torch_varlen`` attention, which has no per-row quadratic cost.
        share_prompts: rows with the same prompt share one copy of it (needs packing and a model
            whose attention takes a dense mask: :func:`ForwardLayout.for_model` resolves it).
        logits_chunk_size: > 0: log-probs from the LM head's input in chunks of this many tokens
            (0: full-vocabulary logits of every position).
        packed_row_multiple: round packed rows up to a multiple of this (few distinct shapes for
            compiled attention kernels).
        compiled_token_stats: run the per-chunk log-prob/entropy math through ``torch.compile``.
    """

    use_remove_padding: bool = False
    max_packed_row_len: int = 0
    share_prompts: bool = False
    logits_chunk_size: int = 4096
    packed_row_multiple: int = 1
    compiled_token_stats: bool = False

    @classmethod
    def for_model(cls, model_config: Any, model: nn.Module, compiled_token_stats: bool = False) -> "ForwardLayout":
        """The layout a loaded model supports, from its ``model`` config node.

        ``share_prompts`` is kept only with packing and sdpa/eager attention; when the config asks
        for it and the model's attention (flash/varlen) takes no custom mask, that is logged once.
        """
        share = model_config.share_prompts and model_config.use_remove_padding
        if share and not supports_custom_mask(model):
            logger.warning("model.share_prompts is off: %s attention takes no custom mask (needs sdpa or eager)",
                           getattr(model.config, "_attn_implementation", "this"))
            share = False
        return cls(use_remove_padding=model_config.use_remove_padding,
                   max_packed_row_len=model_config.max_packed_row_len or 0, share_prompts=share,
                   compiled_token_stats=compiled_token_stats)


def forward_log_probs(model: nn.Module, micro: Any, temperature: float, layout: ForwardLayout,
                      calculate_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the response tokens of one micro-batch.

    Args:
        model: causal LM returning ``.logits`` ``(B, T, V)``.
        micro: mapping with ``input_ids``, ``attention_mask``, ``position_ids`` ``(B, T)`` and
            ``responses`` ``(B, R)``.
        temperature: the sampling temperature; logits are divided by it so the log-probs are those
            of the distribution the rollout sampled from.
        layout: the model's :class:`ForwardLayout`. With ``logits_chunk_size > 0`` the head's
            input is captured and only the response-predicting positions are scored; this falls back
            to full logits when the head is not a plain ``nn.Linear`` or the model post-processes
            logits (soft-capping, scaling). The scores are returned through the model's output (in
            place of its logits), so FSDP2 re-gathers the head weight before their backward as it
            would for logits.
    Returns:
        ``log_probs`` ``(B, R)`` and ``entropy`` ``(B, R)`` (or None), in nats, 0 where the response
        token is padding.
    """
    input_ids, attention_mask = micro["input_ids"], micro["attention_mask"]
    position_ids = micro["position_ids"] if "position_ids" in micro.keys() else F.position_ids_from_mask(attention_mask)
    batch, seqlen = input_ids.shape
    response_length = micro["responses"].shape[1]
    labels = F.next_token_labels(input_ids)
    inputs, src, dst = _model_inputs(model, input_ids, attention_mask, position_ids, seqlen - response_length, layout)
    head = _plain_lm_head(model) if layout.logits_chunk_size > 0 else None
    if head is not None:
        log_probs, entropy = _chunked_response_stats(model, head, inputs, labels, attention_mask, response_length,
                                                     src, dst, temperature, layout, calculate_entropy)
    elif layout.use_remove_padding:
        log_probs, entropy = _packed_full_logits_stats(model, inputs, labels, src, dst, batch, seqlen,
                                                       response_length, temperature, calculate_entropy)
    else:
        logits = model(**inputs, use_cache=False).logits
        logits = F.response_slice(logits, response_length).float() / temperature
        log_probs = F.logprobs_from_logits(logits, F.response_slice(labels, response_length))
        entropy = F.entropy_from_logits(logits) if calculate_entropy else None
    # Targets that are padding have meaningless (and layout-dependent) values: zero them.
    target_valid = attention_mask[:, -response_length:].to(log_probs.dtype)
    log_probs = log_probs * target_valid
    if entropy is not None:
        entropy = entropy * target_valid
    return log_probs, entropy


def _model_inputs(model, input_ids, attention_mask, position_ids, prompt_length: int, layout: ForwardLayout):
    """The forward's inputs in the layout, with ``src``/``dst`` token maps (None when padded)."""
    if not layout.use_remove_padding:
        return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}, None, None
    row_len = packed_row_len(model, layout.max_packed_row_len, input_ids.numel())
    if layout.share_prompts:
        ids, pos, src, dst, mask = pack_shared_prompts(input_ids, attention_mask, position_ids, prompt_length, row_len)
        return {"input_ids": ids, "position_ids": pos, "attention_mask": mask}, src, dst
    ids, pos, src, dst = F.pack_sequences_rows(input_ids, attention_mask, position_ids, row_len,
                                               layout.packed_row_multiple)
    inputs = {"input_ids": ids, "position_ids": pos}
    if _attention(model) == varlen_attention.NAME:
        inputs.update(varlen_attention.boundary_kwargs(pos))  # once per forward, not once per layer
    return inputs, src, dst


def _attention(model: nn.Module) -> str | None:
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def _packed_full_logits_stats(model, inputs, labels, src, dst, batch: int, seqlen: int, response_length: int,
                              temperature: float, calculate_entropy: bool):
    """Full-vocabulary logits of packed rows, unpacked to ``(B, R)`` log-probs (and entropy)."""
    logits = model(**inputs, use_cache=False).logits
    logits = logits.reshape(-1, logits.shape[-1])[dst].float() / temperature
    log_probs = F.pad_packed(F.logprobs_from_logits(logits, labels.reshape(-1)[src]), src, batch, seqlen)
    entropy = None
    if calculate_entropy:
        entropy = F.response_slice(F.pad_packed(F.entropy_from_logits(logits), src, batch, seqlen), response_length)
    return F.response_slice(log_probs, response_length), entropy


def _plain_lm_head(model: nn.Module) -> nn.Linear | None:
    """The output head if logits are exactly ``head(hidden)``, else None (use full logits)."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if type(head) is not nn.Linear:
        return None
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None) not in (None, 1, 1.0):
        return None
    return head


def _chunked_response_stats(model, head, inputs, labels, attention_mask, response_length, src, dst,
                            temperature, layout: ForwardLayout, calculate_entropy):
    """Run the body, capture the head's input, and score only the response-predicting positions."""
    batch, seqlen = attention_mask.shape
    mask = attention_mask.bool()
    # Output t predicts token t+1: keep t in the response range where both t and t+1 are real tokens.
    want = torch.zeros_like(mask)
    first = seqlen - response_length - 1
    want[:, first:seqlen - 1] = mask[:, first:seqlen - 1] & mask[:, first + 1:]
    wanted = torch.nonzero(want.reshape(-1)).squeeze(-1)
    if src is None:
        hidden_index = wanted
    else:
        lookup = torch.full((batch * seqlen,), -1, dtype=torch.long, device=wanted.device)
        lookup[src] = dst
        hidden_index = lookup[wanted]
    captured = {}

    def keep_hidden(module, args):
        captured["hidden"] = args[0]
        return (args[0][..., :0, :],)  # the head itself then produces empty logits

    def score(module, args, output):
        # Runs inside the model's forward (weights gathered) and becomes the model's "logits", so
        # FSDP's pre-backward hook on the output re-gathers the weight for the chunks' recompute.
        hidden = captured.pop("hidden")
        hidden = hidden.reshape(-1, hidden.shape[-1])[hidden_index]
        lp, ent = F.chunked_logprobs_entropy(hidden, module.weight, labels.reshape(-1)[wanted], module.bias,
                                             temperature, layout.logits_chunk_size, calculate_entropy,
                                             compiled=layout.compiled_token_stats)
        ent = ent if ent is not None else torch.zeros_like(lp)
        return torch.stack([lp[None], ent[None]], dim=-1)  # (1, n, 2), a fresh tensor (not a view)

    handles = [head.register_forward_pre_hook(keep_hidden), head.register_forward_hook(score)]
    try:
        stats = model(**inputs, use_cache=False).logits[0]
    finally:
        for handle in handles:
            handle.remove()
    lp, ent = stats[:, 0], (stats[:, 1] if calculate_entropy else None)

    def to_response(values):
        full = values.new_zeros(batch * seqlen).index_copy(0, wanted, values)
        return F.response_slice(full.view(batch, seqlen), response_length)

    return to_response(lp), (to_response(ent) if ent is not None else None)


def forward_values(model: nn.Module, micro: Any, layout: ForwardLayout) -> torch.Tensor:
    """Values ``(B, R)`` of one micro-batch of a value model (0 where the response token is padding).

    Args:
        model: a token-classification model with one label; ``.logits[..., 0]`` is the value.
        micro: mapping with ``input_ids``, ``attention_mask``, ``position_ids`` ``(B, T)`` and
            ``responses`` ``(B, R)``.
        layout: padded or packed (``share_prompts`` and logit chunking do not apply to values).
    Raises:
        ValueError: ``layout.share_prompts`` is set.
    """
    input_ids, attention_mask = micro["input_ids"], micro["attention_mask"]
    position_ids = micro["position_ids"] if "position_ids" in micro.keys() else F.position_ids_from_mask(attention_mask)
    batch, seqlen = input_ids.shape
    response_length = micro["responses"].shape[1]
    if layout.share_prompts:
        raise ValueError("forward_values: share_prompts does not apply to a value model")
    inputs, src, dst = _model_inputs(model, input_ids, attention_mask, position_ids, seqlen - response_length, layout)
    out = model(**inputs, use_cache=False).logits[..., 0]
    if layout.use_remove_padding:
        values = F.pad_packed(out.reshape(-1)[dst].float(), src, batch, seqlen)
    else:
        values = out.float()
    values = F.response_slice(values, response_length)
    return values * attention_mask[:, -response_length:].to(values.dtype)
