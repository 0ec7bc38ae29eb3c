"""Search-R1's environment: ``<search>``/``<answer>`` tags, ``<information>`` observations, EM reward.

A turn ends at ``</search>`` or ``</answer>``; the first complete tag pair of its text is the
action (``parsing.py``). A search's passages come back as Search-R1's observation text
(``prompts.format_observation``), cut to ``data.max_obs_length`` tokens inside the passages so
``</information>`` survives (``observation.py``); an unparsable turn gets Search-R1's invalid-action
message. The reward is exact match on the last ``<answer>``, optionally format-aware
(``reward.py``, ``reward_format.py``), or token F1 with action-level penalties (``style=f1``).
``prompt.*`` re-renders each row's question at load time (another template, the search budget
stated); ``health`` gives the trainer its text-level signals (``health.py``).

Per-row counters: :data:`~search_r1.envs.search_tool.SEARCH_COUNTERS` (the trainer's ``env/*``
metrics under Search-R1's names).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from search_r1.envs.search_r1 import health, reward
from search_r1.envs.search_r1.config import PromptConfig, SearchR1Config
from search_r1.envs.observation import ObservationEncoder
from search_r1.envs.search_r1.parsing import ACTION_PREFIXES, STOP_STRINGS, extract_solution, parse_action
from search_r1.envs.search_r1.prompts import (ENVIRONMENT_TEXT, INVALID_ACTION_MESSAGE, OBSERVATION_HEAD,
                                             OBSERVATION_TAIL, prompt_messages, question_of, template_of)
from search_r1.envs.search_tool import SEARCH_COUNTERS, SearchEnvironment, SearchTool, search_metrics
from search_r1.qa.answers import QA_DATA_SOURCES
from search_r1.qa.rows import flashrag_form
from verl.envs import Action, Observation, ending_tag, register_environment
from verl.utils.config import ConfigError


@register_environment
class SearchR1Environment(SearchEnvironment):
    """Search-R1's multi-turn search task (``env.name=search_r1``, the default).

    Args:
        tokenizer: the policy's tokenizer.
        tool: the :class:`~search_r1.envs.search_tool.SearchTool` (``SearchTool(None)``: no search).
        max_obs_length: token budget of one observation, ``<information>`` wrapper included.
        score_kwargs: the reward's knobs (``QARewardConfig.score_kwargs()``).
        prompt: how rows' prompts are re-rendered (``PromptConfig``; default: as written).
        max_turns: the search budget a re-rendered prompt states (``prompt.state_search_budget``).
    Raises:
        ValueError: ``max_obs_length`` leaves no room for passages.
    """

    name = "search_r1"
    config_class = SearchR1Config
    environment_text = ENVIRONMENT_TEXT
    counters = SEARCH_COUNTERS
    data_sources = QA_DATA_SOURCES
    health_rules = health.HEALTH_RULES
    health_by_source = ("searches",)

    def __init__(self, tokenizer, tool: SearchTool, max_obs_length: int, score_kwargs: Mapping | None = None,
                 prompt: PromptConfig | None = None, max_turns: int | None = None) -> None:
        super().__init__(tokenizer)
        self.tool = tool
        self.observations = ObservationEncoder(tokenizer, max_obs_length, OBSERVATION_HEAD, OBSERVATION_TAIL)
        self.invalid_ids = self.observations.encode(INVALID_ACTION_MESSAGE)
        self.score_kwargs = dict(score_kwargs or {})
        self.max_concurrent_calls = tool.max_concurrency
        self.prompt = prompt or PromptConfig()
        self.search_budget = max_turns if self.prompt.state_search_budget else None

    @classmethod
    def from_config(cls, config: SearchR1Config, tokenizer) -> "SearchR1Environment":
        return cls(tokenizer, SearchTool.from_config(config), config.data.max_obs_length,
                   config.reward_model.score_kwargs(), config.prompt, config.max_turns)

    @classmethod
    def check_ready(cls, config: SearchR1Config) -> None:
        SearchTool.check_ready(config)

    @classmethod
    def describe(cls, config: SearchR1Config) -> dict:
        return {**SearchTool.describe(config), "format_reward": config.reward_model.format_aware,
                "reward": config.reward_model.style, "prompt_template": config.prompt.template or "as written",
                "states_search_budget": config.prompt.state_search_budget}

    # ---- the turns ------------------------------------------------------------------------------
    @property
    def stop_strings(self) -> tuple[str, ...]:
        return STOP_STRINGS

    def open_tag(self, prompt_ids: Sequence[int]) -> str:
        """``<search>``/``<answer>`` when the prompt itself opens the action (a forced assistant prefix)."""
        return ending_tag(self.tokenizer, prompt_ids, ACTION_PREFIXES)

    def parse(self, text: str) -> Action:
        action = parse_action(text)
        counts = {"valid_action": int(action.valid), "valid_search": int(action.kind == "search")}
        kind = {"search": "call", "answer": "final"}.get(action.kind)
        return Action(kind, action.content, counts)

    def invalid(self, action: Action) -> Observation:
        return Observation(self.invalid_ids)

    # ---- scoring and reading trajectories ---------------------------------------------------------
    def compute_score(self, data_source: str, solution_str: str, ground_truth, extra_info=None, **kwargs) -> dict:
        return reward.compute_score(data_source, solution_str, ground_truth, extra_info, **self.score_kwargs, **kwargs)

    def extract_answer(self, response: str) -> Optional[str]:
        return extract_solution(response)

    def question_of(self, prompt: str) -> str:
        return question_of(prompt)

    @classmethod
    def metrics(cls, stats: Mapping[str, Optional[np.ndarray]], prefix: str = "env") -> dict[str, float]:
        return search_metrics(stats, prefix)

    def health(self, responses: Sequence[str]) -> dict[str, np.ndarray]:
        return health.health_signals(responses)

    # ---- data ------------------------------------------------------------------------------------
    def row_form(self):
        return flashrag_form(prompt_messages)

    def prompt_messages(self, row: dict, messages: list[dict]) -> list[dict]:
        """A row's user turn re-rendered under ``prompt.template`` (its own template when null) and
        with the search budget stated when ``prompt.state_search_budget``; as written otherwise.

        Raises:
            ConfigError: a re-rendering was asked for and the row's prompt is not one user turn
                written with one of Search-R1's templates.
        """
        if not self.prompt.rewrites:
            return messages
        found = template_of(str(messages[0].get("content", ""))) if len(messages) == 1 else None
        if found is None:
            raise ConfigError(f"prompt.template={self.prompt.template} / prompt.state_search_budget="
                              f"{str(self.prompt.state_search_budget).lower()}: the row's prompt is not one user turn "
                              f"written with a Search-R1 template, so it cannot be re-rendered: {messages!r:.160}")
        written_with, question = found
        return prompt_messages(question, self.prompt.template or written_with, self.search_budget)

    @classmethod
    def report_writer(cls):
        from search_r1.report import write_report
        return write_report


def search_rollout(tokenizer, engine, retriever, loop, max_obs_length: int):
    """The Search-R1 rollout outside the trainer (``infer.py``, the warm start's evaluation, benchmarks).

    Args:
        retriever: a retriever client (``retrieve``, and ``session`` for the async mode), or None
            for no search.
        loop: the :class:`~verl.workers.rollout.agent_loop.LoopConfig`.
        max_obs_length: token budget of one observation.
    Returns:
        a :class:`~verl.workers.rollout.agent_loop.MultiTurnRollout`.
    """
    from verl.workers.rollout.agent_loop import MultiTurnRollout

    return MultiTurnRollout(tokenizer, engine, SearchR1Environment(tokenizer, SearchTool(retriever), max_obs_length), loop)
