"""Settings of the rule reward (``reward_model``): exact match, optionally format-aware."""

from __future__ import annotations

from dataclasses import dataclass

REWARD_STYLES = ("em", "format")


@dataclass(frozen=True)
class RewardModelConfig:
    """EM on the last ``<answer>`` (SQuAD normalisation), with Search-R1's format scores."""

    style: str = "em"
    """`em`: plain exact match, or the format-aware score when any format score below is non-zero;
    `format`: always the format-aware score (`verl.trainer.main_ppo_format` sets it)"""
    format_score: float = 0.0
    """plain EM reward: score of a well-formed `<answer>` that does not match"""
    structure_format_score: float = 0.0
    """format-aware reward: score of a well-formed trajectory with a wrong answer"""
    final_format_score: float = 0.0
    """format-aware reward: score of a parsable final answer with bad structure"""
    retrieval_score: float = 0.0
    """format-aware reward: bonus when the answer appears in the retrieved passages"""
    num_examine: int = 1
    """decoded samples printed per training step (debugging)"""
