"""Shared-prompt packing: compute each distinct prompt once for all the responses that follow it.

GRPO (and PPO with ``rollout.n > 1``) scores ``n`` responses per prompt. A padded or plainly packed
forward runs the prompt ``n`` times; with Search-R1's prompt (~160 tokens) and short answers the
prompt is most of the compute. Here every group of rows with the same prompt becomes one *unit*
``[prompt, response_1, ..., response_k]`` in a packed row, with a custom attention mask: a response
token sees the prompt and the earlier tokens of its own response, nothing of its siblings. Positions
continue from the prompt in each response, so every token's attention context, position and hence
output equal those of the padded forward. Gradients are exact too: the shared prompt's activations
receive the sum of the gradients the ``k`` copies would have received (the training equivalence of
Liu et al. 2025, "Prefix Grouper: Efficient GRPO Training through Shared-Prefix Forward",
arXiv:2506.05433, done here with a mask instead of a split attention).

The mask is dense ``(rows, 1, L, L)`` booleans, so this is for sdpa/eager attention (flash-attention
varlen kernels take no custom mask); :func:`supports_custom_mask` says whether a model qualifies.
"""

from __future__ import annotations

import torch

from verl.utils.seqlen_balancing import rearrange_micro_batches


def supports_custom_mask(model: torch.nn.Module) -> bool:
    """True when the model's attention takes a dense 4-D mask (``sdpa`` or ``eager``)."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) in ("sdpa", "eager")


def _units(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
           max_row_len: int) -> list[tuple[list[int], int]]:
    """Rows grouped by identical prompt tokens: ``[(rows, unit_len), ...]`` in first-seen order.

    A group whose unit would exceed ``max_row_len`` is split (each part repeats the prompt).
    """
    groups: dict[bytes, list[int]] = {}
    prompt_mask = attention_mask[:, :prompt_length].bool().cpu()  # one transfer, not one per row
    prompt_ids = input_ids[:, :prompt_length].cpu()
    for row in range(prompt_ids.shape[0]):
        groups.setdefault(prompt_ids[row][prompt_mask[row]].numpy().tobytes(), []).append(row)
    prompt_lens = prompt_mask.long().sum(-1).tolist()
    response_lens = attention_mask[:, prompt_length:].long().sum(-1).tolist()
    units = []
    for rows in groups.values():
        part, length = [], prompt_lens[rows[0]]
        for row in rows:
            if part and length + response_lens[row] > max_row_len:
                units.append((part, length))
                part, length = [], prompt_lens[rows[0]]
            part.append(row)
            length += response_lens[row]
        units.append((part, length))
    return units


def pack_shared_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                        prompt_length: int, max_row_len: int) -> tuple[torch.Tensor, ...]:
    """Pack rows into ``k`` rows of at most ``max_row_len`` tokens, each distinct prompt once per unit.

    Args:
        input_ids, attention_mask, position_ids: ``(B, T)``, prompt left-padded in the first
            ``prompt_length`` columns, response right-padded after it (the rollout's layout).
        prompt_length: ``P``, the width of the prompt columns.
        max_row_len: token budget of one packed row (raised to the longest unit if that is longer).
    Returns:
        ``packed_ids`` ``(k, L)``, ``packed_position_ids`` ``(k, L)``, ``src`` ``(M,)`` indices of
        the valid tokens in the flattened ``(B*T,)`` batch, ``dst`` ``(M,)`` their slots in the
        flattened ``(k*L,)`` packed batch (prompt slots repeat: rows of a unit share them) and
        ``mask`` ``(k, 1, L, L)`` bool, True where query slot ``i`` may attend to key slot ``j``.
        Unused tail slots attend only to themselves (their outputs are never read).
    """
    units = _units(input_ids, attention_mask, prompt_length, max_row_len)
    rows_of_units = rearrange_micro_batches([length for _, length in units],
                                            max(int(max_row_len), max(length for _, length in units)))
    row_len = max(sum(units[u][1] for u in packed) for packed in rows_of_units)
    seqlen = input_ids.shape[1]
    valid = attention_mask.bool().cpu()
    src, dst = [], []
    # Per slot: the unit it belongs to and which member's response (-1: the shared prompt).
    unit_of = torch.arange(-1, -len(rows_of_units) * row_len - 1, -1)  # unused slots: unique ids
    member_of = torch.full((len(rows_of_units) * row_len,), -1)
    for k, packed in enumerate(rows_of_units):
        offset = k * row_len
        for u in packed:
            rows, length = units[u]
            prompt_cols = torch.nonzero(valid[rows[0], :prompt_length]).squeeze(-1)
            unit_of[offset:offset + length] = u
            prompt_slots = torch.arange(offset, offset + len(prompt_cols))
            offset += len(prompt_cols)
            for row in rows:
                response_cols = prompt_length + torch.nonzero(valid[row, prompt_length:]).squeeze(-1)
                response_slots = torch.arange(offset, offset + len(response_cols))
                member_of[response_slots] = row
                offset += len(response_cols)
                src += [row * seqlen + prompt_cols, row * seqlen + response_cols]
                dst += [prompt_slots, response_slots]
    device = input_ids.device
    src, dst = torch.cat(src).to(device), torch.cat(dst).to(device)
    packed_ids = torch.zeros(len(rows_of_units) * row_len, dtype=input_ids.dtype, device=device)
    packed_ids[dst] = input_ids.reshape(-1)[src]
    packed_pos = torch.zeros(len(rows_of_units) * row_len, dtype=position_ids.dtype, device=device)
    packed_pos[dst] = position_ids.reshape(-1)[src]
    mask = _unit_mask(unit_of.view(-1, row_len), member_of.view(-1, row_len)).to(device)
    shape = (len(rows_of_units), row_len)
    return packed_ids.view(shape), packed_pos.view(shape), src, dst, mask


def _unit_mask(unit_of: torch.Tensor, member_of: torch.Tensor) -> torch.Tensor:
    """``(k, 1, L, L)``: same unit, causal, and the key is prompt or the query's own response."""
    length = unit_of.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    same_unit = unit_of[:, :, None] == unit_of[:, None, :]
    key_visible = (member_of[:, None, :] == -1) | (member_of[:, None, :] == member_of[:, :, None])
    return (causal & same_unit & key_visible).unsqueeze(1)
