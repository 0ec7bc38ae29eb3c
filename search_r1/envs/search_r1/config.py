"""The configuration of a run in the Search-R1 environment: the trainer's tree plus Search-R1's keys.

``retriever``, ``do_search`` (the search tool's, :mod:`search_r1.envs.search_tool`) and the format
scores of ``reward_model`` are Search-R1's own keys (its ``ppo_trainer.yaml``); they belong to this
environment, so they are declared here, beside the trainer's sections that
:class:`~verl.trainer.ppo.config.PPOConfig` declares. ``prompt`` re-renders the rows' questions at
load time (another template, a stated search budget); ``reward_model.style=f1`` is the F1 reward
with Search-R1++'s action-level penalties (``reward.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from search_r1.envs.search_r1.prompts import TEMPLATES
from search_r1.envs.search_tool import SearchRunConfig
from verl.utils.config import ConfigError
from verl.workers.reward_manager.config import RewardModelConfig

REWARD_STYLES = ("em", "format", "f1")


@dataclass(frozen=True)
class QARewardConfig(RewardModelConfig):
    """EM on the last ``<answer>`` (SQuAD normalisation), with Search-R1's format scores, or token F1
    with action-level penalties."""

    style: str = "em"
    """`em`: plain exact match, or the format-aware score when any format score below is non-zero;
    `format`: always the format-aware score (`verl.trainer.main_ppo_format` sets it); `f1`: SQuAD token
    F1 of the last answer minus the two action penalties below (Search-R1++'s F1+, Xu et al. 2026)"""
    format_score: float = 0.0
    """plain EM reward: score of a well-formed `<answer>` that does not match"""
    structure_format_score: float = 0.0
    """format-aware reward: score of a well-formed trajectory with a wrong answer"""
    final_format_score: float = 0.0
    """format-aware reward: score of a parsable final answer with bad structure"""
    retrieval_score: float = 0.0
    """format-aware reward: bonus when the answer appears in the retrieved passages"""
    no_answer_penalty: float = 0.0
    """`f1` reward: subtracted when the response gives no `<answer>` (Search-R1++: 0.1; without it F1
    training collapses by answer avoidance)"""
    no_search_penalty: float = 0.0
    """`f1` reward: subtracted when the response never searches (Search-R1++: 0.1)"""

    def __post_init__(self) -> None:
        if self.style not in REWARD_STYLES:
            raise ConfigError(f"reward_model.style: {self.style!r} is not one of {', '.join(REWARD_STYLES)}")
        penalties = {"no_answer_penalty": self.no_answer_penalty, "no_search_penalty": self.no_search_penalty}
        if self.style != "f1" and any(penalties.values()):
            set_keys = ", ".join(f"reward_model.{k}={v}" for k, v in penalties.items() if v)
            raise ConfigError(f"{set_keys} applies to the f1 reward only: set reward_model.style=f1 (got {self.style!r})")
        formats = ("structure_format_score", "final_format_score", "retrieval_score", "format_score")
        if self.style == "f1" and any(getattr(self, key) for key in formats):
            set_keys = ", ".join(f"reward_model.{k}" for k in formats if getattr(self, k))
            raise ConfigError(f"{set_keys}: format scores do not combine with reward_model.style=f1; set them to 0")

    def score_kwargs(self) -> dict:
        """The knobs of :func:`search_r1.envs.search_r1.reward.compute_score`."""
        if self.style == "f1":
            return {"style": "f1", "no_answer_penalty": self.no_answer_penalty,
                    "no_search_penalty": self.no_search_penalty}
        return {"format_score": self.format_score, "structure_format_score": self.structure_format_score,
                "final_format_score": self.final_format_score, "retrieval_score": self.retrieval_score,
                "format_aware": self.style == "format"}

    @property
    def format_aware(self) -> bool:
        """Whether the training reward is the format-aware score."""
        return self.style == "format" or any(
            (self.structure_format_score, self.final_format_score, self.retrieval_score))


@dataclass(frozen=True)
class PromptConfig:
    """The question prompt of each row, re-rendered when the data is loaded (``prompt``).

    Data rows carry their prompt, written by the data scripts with one of the templates; these keys
    rewrite a row's question with another template and/or a stated search budget, so one data set
    serves every variant.
    """

    template: Optional[str] = None
    """`null`: each row's prompt as written; `base` (Search-R1's), `instruct` or `fast` (Search-R1++'s
    Fast Thinking template, Xu et al. 2026): every row's question under that template"""
    state_search_budget: bool = False
    """say "You can search at most <max_turns> times." in place of "as many times as you want" (the
    budget the agent loop enforces)"""

    def __post_init__(self) -> None:
        if self.template is not None and self.template not in TEMPLATES:
            raise ConfigError(f"prompt.template={self.template!r}: choose one of {', '.join(TEMPLATES)} (or null)")

    @property
    def rewrites(self) -> bool:
        """Whether rows are re-rendered at all."""
        return self.template is not None or self.state_search_budget


@dataclass(frozen=True)
class SearchR1Config(SearchRunConfig):
    """A run in the Search-R1 environment (``env.name=search_r1``): Search-R1's whole key tree."""

    reward_model: QARewardConfig = field(default_factory=QARewardConfig)
    """the rule reward"""
    prompt: PromptConfig = field(default_factory=PromptConfig)
    """the question prompt (re-rendered at load time)"""
