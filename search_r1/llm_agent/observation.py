"""Token ids of what the environment appends after a turn: passages or the corrective message.

Observations are tokenised on their own and appended to the engine's token ids, so the trajectory
is token-exact. A search observation longer than ``max_obs_length`` tokens is cut inside the
passages; the ``<information>`` wrapper's tokens are kept whole so ``</information>`` survives
(Search-R1 cut the end of the block off).
"""

from __future__ import annotations

from collections import OrderedDict
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

    CACHE_SIZE = 8192  # observations kept: a GRPO group's rows often search the same query

    def __init__(self, tokenizer, max_obs_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_obs_length = max_obs_length
        self._cache: OrderedDict[str, tuple[list[int], bool]] = OrderedDict()
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
        tokenised on its own. Results are cached by passage text (tokenising a 3-passage block
        takes ~1 ms, and the rows of a group mostly retrieve the same passages); the caller gets
        its own copy of the ids.
        """
        passages = format_passages(docs)
        cached = self._cache.get(passages)
        if cached is None:
            cached = self._encode_search(passages)
            self._cache[passages] = cached
            if len(self._cache) > self.CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(passages)
        ids, cut = cached
        return list(ids), cut

    def _encode_search(self, passages: str) -> tuple[list[int], bool]:
        ids = self.encode(format_observation(passages))
        if len(ids) <= self.max_obs_length:
            return ids, False
        room = self.max_obs_length - len(self.head_ids) - len(self.tail_ids)
        body = self.encode(passages.strip())[:room]
        return self.head_ids + body + self.tail_ids, True
