"""Settings of the rule reward (``reward_model``); an environment's class adds its own score knobs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewardModelConfig:
    """The environment's rule reward (``Environment.compute_score``) on each decoded response."""

    num_examine: int = 1
    """decoded samples printed per training step (debugging)"""
