"""Token ids of what an environment appends after a turn: a tool's answer inside its wrapper.

Observations are tokenised on their own and appended to the engine's token ids, so the trajectory
is token-exact. An observation longer than ``max_obs_length`` tokens is cut inside its content; the
wrapper's tokens (Search-R1's ``<information>`` block, a chat template's tool turn) are kept whole,
so the closing tag survives (Search-R1 cut the end of the block off).
"""

from __future__ import annotations

from collections import OrderedDict


class ObservationEncoder:
    """Encodes ``head + content + tail`` observations for one tokenizer.

    Args:
        tokenizer: the policy's tokenizer (special tokens written in the text are parsed as such).
        max_obs_length: token budget of one observation, wrapper included.
        head, tail: the wrapper's text around the content.
    Raises:
        ValueError: ``max_obs_length`` leaves no room for content inside the wrapper.
    """

    CACHE_SIZE = 8192  # observations kept: a GRPO group's rows often get the same passages

    def __init__(self, tokenizer, max_obs_length: int, head: str, tail: str) -> None:
        self.tokenizer = tokenizer
        self.max_obs_length = max_obs_length
        self.head, self.tail = head, tail
        self._cache: OrderedDict[str, tuple[list[int], bool]] = OrderedDict()
        self.head_ids = self.encode(head)
        self.tail_ids = self.encode(tail)
        if max_obs_length <= len(self.head_ids) + len(self.tail_ids):
            raise ValueError(f"max_obs_length={max_obs_length} leaves no room inside the "
                             f"{len(self.head_ids) + len(self.tail_ids)}-token observation wrapper {head.strip()!r}")

    def __getstate__(self) -> dict:
        """Sent to other processes without the tokenizer (the receiver binds its own: :meth:`bind`)
        and with an empty cache."""
        return {**self.__dict__, "tokenizer": None, "_cache": OrderedDict()}

    def bind(self, tokenizer) -> None:
        """Encode with ``tokenizer`` (the receiver's copy of the one this encoder was built with)."""
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise RuntimeError("this observation encoder was unpickled without its tokenizer: bind(tokenizer) first")
        return self.tokenizer.encode(text, add_special_tokens=False)

    def wrap(self, content: str) -> tuple[list[int], bool]:
        """Token ids of ``head + content + tail`` and whether the content was cut to the budget.

        Fits: the whole string tokenised at once. Too long: head + content cut + tail, each
        tokenised on its own. Results are cached by content (tokenising a 3-passage block takes
        ~1 ms, and the rows of a group mostly retrieve the same passages); the caller gets its own
        copy of the ids.
        """
        cached = self._cache.get(content)
        if cached is None:
            cached = self._encode(content)
            self._cache[content] = cached
            if len(self._cache) > self.CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(content)
        ids, cut = cached
        return list(ids), cut

    def _encode(self, content: str) -> tuple[list[int], bool]:
        ids = self.encode(self.head + content + self.tail)
        if len(ids) <= self.max_obs_length:
            return ids, False
        room = self.max_obs_length - len(self.head_ids) - len(self.tail_ids)
        return self.head_ids + self.encode(content)[:room] + self.tail_ids, True
