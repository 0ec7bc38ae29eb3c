"""Token ids of what the environment appends after a turn: passages or the corrective message.

Observations are tokenised on their own and appended to the engine's token ids, so the trajectory
is token-exact. A search observation longer than ``max_obs_length`` tokens is cut inside the
passages; the ``<information>`` wrapper's tokens are kept whole so ``</information>`` survives
(Search-R1 cut the end of the block off).
"""

from __future__ import annotations

from typing import Sequence

from search_r1.prompts import INVALID_ACTION_MESSAGE, format_observation, format_passages

OBS_HEAD, OBS_TAIL = format_observation("X").split("X")


class ObservationEncoder:
    """Encodes observations for one tokenizer.

    Args:
        max_obs_length: token budget of one search observation, wrapper included.
    Raises:
        ValueError: ``max_obs_length`` leaves no room for passages inside the wrapper.
    """

    def __init__(self, tokenizer, max_obs_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_obs_length = max_obs_length
        self.head_ids = self.encode(OBS_HEAD)
        self.tail_ids = self.encode(OBS_TAIL)
        if max_obs_length <= len(self.head_ids) + len(self.tail_ids):
            raise ValueError(f"max_obs_length={max_obs_length} leaves no room for passages inside "
                             f"the {len(self.head_ids) + len(self.tail_ids)}-token <information> wrapper")
        self.invalid_ids = self.encode(INVALID_ACTION_MESSAGE)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def search(self, docs: Sequence[dict]) -> tuple[list[int], bool]:
        """Token ids of ``format_observation(format_passages(docs))`` and whether they were cut.

        Fits: the whole string tokenised at once. Too long: head + passages cut + tail, each
        tokenised on its own.
        """
        passages = format_passages(docs)
        ids = self.encode(format_observation(passages))
        if len(ids) <= self.max_obs_length:
            return ids, False
        room = self.max_obs_length - len(self.head_ids) - len(self.tail_ids)
        body = self.encode(passages.strip())[:room]
        return self.head_ids + body + self.tail_ids, True
