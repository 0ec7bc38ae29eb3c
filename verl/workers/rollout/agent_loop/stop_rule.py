"""Where a turn that stopped on one of the environment's stop strings (``</search>``, ``</answer>``,
``</tool_call>``) ends: exactly at the stop string.

An engine stops on the token that completes a stop string, and byte-level BPE vocabularies merge
the closing ``>`` with what usually follows it: SmolLM2 has ``><`` and ``>.``, Qwen2.5 ``>.``,
``>\\n`` and ``>\\n\\n``. Kept as sampled, such a token puts text after the stop string into the
trajectory (``...</search><`` then ``\\n\\n<information>``): the model is trained on it and
conditioned on it in the next turn, and the format reward sees stray text between the blocks.

The rule: a turn ends exactly at its stop string. When the completing token carries more text,
that token is dropped (with its log-prob) and the part of the stop string it held (usually ``>``)
is appended as environment tokens, ``response_mask = 0``, like an observation. Every trained token
is still a sampled token with its rollout log-prob, and the trajectory's ids are exactly the ids
the model is conditioned on in the next turn (the next context *is* prompt + response). Only the
one merged token goes untrained.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from verl.workers.rollout.base import first_stop


def split_at_stop(tokenizer, token_ids: Sequence[int], stops: Iterable[str],
                  text: str | None = None) -> tuple[int, list[int]]:
    """How many sampled tokens a stopped turn keeps, and the environment tokens that close it.

    Args:
        tokenizer: the policy's tokenizer.
        token_ids: the turn's sampled ids; the engine stopped on the first of ``stops`` in their text.
        text: their decoded text (special tokens kept), when the caller has it already.
    Returns:
        ``(keep, tail_ids)``: keep ``token_ids[:keep]`` (mask 1) and append ``tail_ids`` (mask 0).
        ``(len(token_ids), [])`` when the text already ends at the stop string, or when it has no
        stop string, or when the kept tokens' text is not a prefix of the turn's text (a multi-byte
        character split across the dropped token: the turn is then left as sampled).
    """
    if text is None:
        text = tokenizer.decode(list(token_ids), skip_special_tokens=False)
    match = first_stop(text, stops)
    if match is None or match[0] == len(text):
        return len(token_ids), []
    end = match[0]
    keep = len(token_ids)
    while keep > 0 and len(tokenizer.decode(list(token_ids[:keep - 1]), skip_special_tokens=False)) >= end:
        keep -= 1  # token_ids[keep - 1] is the one that completes the stop string
    done = tokenizer.decode(list(token_ids[:keep]), skip_special_tokens=False)
    if len(done) == end:
        return keep, []
    before = tokenizer.decode(list(token_ids[:keep - 1]), skip_special_tokens=False)
    if not text.startswith(before):
        return len(token_ids), []
    return keep - 1, tokenizer.encode(text[len(before):end], add_special_tokens=False)
