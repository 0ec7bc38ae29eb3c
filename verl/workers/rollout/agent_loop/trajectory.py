"""Per-row state of a multi-turn rollout: the token lists, the loop's flags and the environment's counters."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence


@dataclass
class Trajectory:
    """One row: its prompt ids and the response built turn by turn.

    ``response_mask`` is 1 on engine-generated tokens and 0 on environment tokens; ``log_probs``
    holds the engine's log-prob for generated tokens and 0.0 for environment tokens, or is None
    when the rollout does not ask the engine for log-probs. ``counts``
    holds the environment's per-row counters (``Environment.counters``).
    """

    prompt: list[int]
    open_tag: str = ""  # an action the prompt opened (forced prefix): Environment.open_tag
    response: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: Optional[list[float]] = field(default_factory=list)
    active: bool = True
    turns: int = 0
    finished: bool = False
    truncated: bool = False
    counts: Counter = field(default_factory=Counter)

    @property
    def context(self) -> list[int]:
        return self.prompt + self.response

    def add_generated(self, token_ids: Sequence[int], log_probs: Sequence[float]) -> None:
        """Appends engine tokens; ``log_probs`` (one per token) are kept unless ``self.log_probs`` is None.

        Raises:
            ValueError: log-probs are recorded and the engine returned a different number of them.
        """
        if self.log_probs is not None:
            if len(log_probs) != len(token_ids):
                raise ValueError(f"engine returned {len(token_ids)} tokens but {len(log_probs)} log-probs; "
                                 "request logprobs=True")
            self.log_probs.extend(float(x) for x in log_probs)
        self.response.extend(token_ids)
        self.response_mask.extend([1] * len(token_ids))

    def add_environment(self, token_ids: Sequence[int]) -> None:
        self.response.extend(token_ids)
        self.response_mask.extend([0] * len(token_ids))
        if self.log_probs is not None:
            self.log_probs.extend([0.0] * len(token_ids))

    def count(self, counts: Mapping[str, int]) -> None:
        self.counts.update(counts)

    def end(self, finished: bool = False, truncated: bool = False) -> None:
        self.active = False
        self.finished = self.finished or finished
        self.truncated = self.truncated or truncated
