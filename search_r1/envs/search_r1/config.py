"""The configuration of a run in the Search-R1 environment: the trainer's tree plus Search-R1's keys.

``retriever``, ``do_search`` (the search tool's, :mod:`search_r1.envs.search_tool`) and the format
scores of ``reward_model`` are Search-R1's own keys (its ``ppo_trainer.yaml``); they belong to this
environment, so they are declared here, beside the trainer's sections that
:class:`~verl.trainer.ppo.config.PPOConfig` declares.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from search_r1.envs.search_tool import SearchRunConfig
from verl.utils.config import ConfigError
from verl.workers.reward_manager.config import RewardModelConfig

REWARD_STYLES = ("em", "format")


@dataclass(frozen=True)
class QARewardConfig(RewardModelConfig):
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

    def __post_init__(self) -> None:
        if self.style not in REWARD_STYLES:
            raise ConfigError(f"reward_model.style: {self.style!r} is not one of {', '.join(REWARD_STYLES)}")

    def score_kwargs(self) -> dict:
        """The knobs of :func:`search_r1.envs.search_r1.reward.compute_score`."""
        return {"format_score": self.format_score, "structure_format_score": self.structure_format_score,
                "final_format_score": self.final_format_score, "retrieval_score": self.retrieval_score,
                "format_aware": self.style == "format"}

    @property
    def format_aware(self) -> bool:
        """Whether the training reward is the format-aware score."""
        return self.style == "format" or any(
            (self.structure_format_score, self.final_format_score, self.retrieval_score))


@dataclass(frozen=True)
class SearchR1Config(SearchRunConfig):
    """A run in the Search-R1 environment (``env.name=search_r1``): Search-R1's whole key tree."""

    reward_model: QARewardConfig = field(default_factory=QARewardConfig)
    """the rule reward"""
