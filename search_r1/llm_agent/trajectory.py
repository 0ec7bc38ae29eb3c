"""Per-row state of a multi-turn rollout: the token lists and the row's statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class Trajectory:
    """One row: its prompt ids and the response built turn by turn.

    ``response_mask`` is 1 on engine-generated tokens and 0 on observation tokens; ``log_probs``
    holds the engine's log-prob for generated tokens and 0.0 for observations.
    """

    prompt: list[int]
    open_tag: str = ""  # an action tag the prompt opened (forced prefix), see generation._open_tag
    response: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    active: bool = True
    turns: int = 0
    valid_search: int = 0
    valid_action: int = 0
    finished: bool = False
    truncated: bool = False
    obs_truncated: int = 0
    empty_search: int = 0  # searches answered with no passage (a failing web backend serves those)

    @property
    def context(self) -> list[int]:
        return self.prompt + self.response

    def add_generated(self, token_ids: Sequence[int], log_probs: Sequence[float]) -> None:
        if len(log_probs) != len(token_ids):
            raise ValueError(f"engine returned {len(token_ids)} tokens but {len(log_probs)} log-probs; "
                             "request logprobs=True")
        self.response.extend(token_ids)
        self.response_mask.extend([1] * len(token_ids))
        self.log_probs.extend(float(x) for x in log_probs)

    def add_observation(self, token_ids: Sequence[int]) -> None:
        self.response.extend(token_ids)
        self.response_mask.extend([0] * len(token_ids))
        self.log_probs.extend([0.0] * len(token_ids))

    def end(self, finished: bool = False, truncated: bool = False) -> None:
        self.active = False
        self.finished = self.finished or finished
        self.truncated = self.truncated or truncated
