"""What the trainer needs from an environment: one small interface, no knowledge of any tool.

An environment owns the text of a multi-turn task: its prompt form, the stop strings that end a
turn, how a turn's text becomes an action, what its tools answer and how that answer is rendered as
tokens, the reward of a finished trajectory, and its per-row statistics. The trainer's agent loop
(:mod:`verl.workers.rollout.agent_loop`) owns the rest: budgets, turn order, token bookkeeping,
sync/async scheduling and tensor packing.

A run picks its environment by name (``env.name``, :mod:`verl.envs.registry`); the environment class
carries the configuration class of a run with it (its own sections beside the trainer's).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, ClassVar, Mapping, Optional, Sequence

import numpy as np


def ending_tag(tokenizer, prompt_ids: Sequence[int], tags: Sequence[str]) -> str:
    """The tag of ``tags`` the prompt's text ends with, or ``""``: what :meth:`Environment.open_tag`
    answers. Decodes as many trailing ids as the longest tag has characters (a token holds at least
    one), so a tag split into many tokens (SmolLM2: ``<tool_call>`` is five) is still seen."""
    window = max(len(tag) for tag in tags)
    tail = tokenizer.decode(list(prompt_ids[-window:]), skip_special_tokens=False)
    return next((tag for tag in tags if tail.endswith(tag)), "")


@dataclass(frozen=True)
class EnvConfig:
    """Which environment the run trains in (``env``)."""

    name: str = "search_r1"
    """registered environment: `search_r1` (Search-R1's tags) or `tool_call` (the chat template's tool calls)"""
    module: Optional[str] = "search_r1.envs"
    """module imported first, which registers environments (this project's registers both; `null`: only
    the `verl.environments` entry points of installed packages are searched)"""


@dataclass(frozen=True)
class Action:
    """What one turn asked for.

    Attributes:
        kind: ``"call"`` (a tool call, run between turns), ``"final"`` (the answer: ends the row) or
            ``None`` (invalid: the environment's corrective observation is appended).
        content: the call's argument (e.g. a query) or the answer text.
        counts: per-row counters this action adds (keys of ``Environment.counters``).
    """

    kind: Optional[str]
    content: Any = None
    counts: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Observation:
    """Environment tokens appended to a trajectory (``response_mask`` 0) and the counters they add."""

    ids: list[int]
    counts: Mapping[str, int] = field(default_factory=dict)


class Environment(abc.ABC):
    """A multi-turn task the agent loop runs; subclasses are registered by name.

    Class attributes:
        name: the registry name (``env.name``).
        config_class: the run's configuration class (``PPOConfig`` or a subclass adding this
            environment's sections); ``verl.trainer.ppo.config.load_config`` types the tree with it.
        environment_text: matches the text the environment writes into a trajectory (SFT data
            masks it out of the loss).
        counters: per-row integer statistics the environment's actions and observations count.
        data_sources: the ``data_source`` values it has a reward for (None: any).

    Instances are bound to a tokenizer and picklable: the agent loop sends them to the rollout
    workers every step without the tokenizer (unpickling a 49k-vocabulary fast tokenizer takes
    ~0.2 s), and the worker binds its own copy of the policy's tokenizer (:meth:`bind`).
    """

    name: ClassVar[str]
    config_class: ClassVar[type]
    environment_text: ClassVar[re.Pattern]
    counters: ClassVar[tuple[str, ...]] = ()
    data_sources: ClassVar[Optional[frozenset]] = None
    """the ``data_source`` values :meth:`compute_score` scores (None: any)"""
    health_rules: ClassVar[Mapping[str, tuple[str, float]]] = {}
    """alarm rules of :meth:`health` signals: name -> (kind, threshold), kind ``rise`` / ``fall``
    (the step's mean moved up / down by more than the threshold from its mean over the run's first
    steps) or ``grow`` (the mean divided by that start exceeds the threshold); see
    :mod:`verl.trainer.ppo.health`"""
    health_by_source: ClassVar[tuple[str, ...]] = ()
    """:meth:`health` signals also reported per data source (``health/<name>/<data_source>``)"""
    max_concurrent_calls: int = 0
    """tool calls in flight at once in the async loop (0: no cap); the loop splits it over workers"""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def bind(self, tokenizer) -> "Environment":
        """This environment with ``tokenizer`` (the receiver's copy of the policy's tokenizer, after
        pickling dropped it); environments holding it elsewhere too extend this. Returns self."""
        self.tokenizer = tokenizer
        return self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["tokenizer"] = None  # the receiver binds its own (bind)
        return state

    # ---- built from a run's configuration ------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def from_config(cls, config, tokenizer) -> "Environment":
        """The environment of a run (``config`` an instance of ``config_class``)."""

    @classmethod
    def check_ready(cls, config) -> None:
        """Fail fast (before any worker starts) when a tool the run calls is not reachable.

        Raises:
            ValueError: one line naming the setting and what failed.
        """

    # ---- the turns ------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def stop_strings(self) -> tuple[str, ...]:
        """Strings that end a turn (kept in the output)."""

    def open_tag(self, prompt_ids: Sequence[int]) -> str:
        """The action a prompt itself opened (a forced assistant prefix), or ``""``; the first turn
        is parsed as its continuation and the reward scores ``open_tag + response``."""
        return ""

    @abc.abstractmethod
    def parse(self, text: str) -> Action:
        """The action of one turn's generated text (the first turn's text starts with the
        prompt's :meth:`open_tag`)."""

    @abc.abstractmethod
    def invalid(self, action: Action) -> Observation:
        """What the environment answers to an invalid action."""

    @abc.abstractmethod
    def call_tools(self, calls: list[Action]) -> list[Observation]:
        """Run a turn's tool calls at once (the sync loop); one observation per call, in order.

        Raises:
            an error of the tool that failed for good (the step fails, naming the tool).
        """

    @contextlib.asynccontextmanager
    async def tool_session(self) -> AsyncIterator[Callable[[list[Action]], Awaitable[list[Observation]]]]:
        """``async call(actions) -> observations`` (one per action, in order) for one async rollout,
        entered on an event loop of its own thread; the rollout batches the calls its trajectories
        make at about the same time. The default runs :meth:`call_tools` in a worker thread;
        environments with an async client override it (one connection pool for the rollout)."""
        async def call(actions: list[Action]) -> list[Observation]:
            return await asyncio.to_thread(self.call_tools, actions)
        yield call

    # ---- scoring and reading trajectories ---------------------------------------------------------
    @abc.abstractmethod
    def compute_score(self, data_source: str, solution_str: str, ground_truth, extra_info=None,
                      **kwargs) -> float | dict:
        """Reward of one decoded response: a float or ``{"score", ...}`` (other keys are per-row
        extras, e.g. ``em``). ``kwargs`` may hold ``action_prefix`` (see :meth:`open_tag`)."""

    @classmethod
    def describe(cls, config) -> dict:
        """The environment's settings as the evaluation report records them; ``summary`` (a phrase
        for the table's title) and ``format_reward`` (the table shows the format score) when it has them."""
        return {}

    def extract_answer(self, response: str) -> Optional[str]:
        """The final answer written in a decoded response (validation records), or None."""
        return None

    def question_of(self, prompt: str) -> str:
        """The question of a decoded prompt (validation records)."""
        return prompt.strip()

    @classmethod
    def metrics(cls, stats: Mapping[str, Optional[np.ndarray]], prefix: str = "env") -> dict[str, float]:
        """``<prefix>/*`` figures from per-row statistics (the loop's ``turns``, ``finished`` and
        this environment's counters), each a mean over rows."""
        return {}

    def health(self, responses: Sequence[str]) -> dict[str, np.ndarray]:
        """Text-level signals of training health: per-row float arrays ``(B,)`` by name (NaN where
        a signal does not apply to a row), computed on every training step's decoded responses
        (each starting with its :meth:`open_tag`); the trainer logs their means as ``health/<name>``
        and watches them with :attr:`health_rules`. Default: none."""
        return {}

    # ---- data ------------------------------------------------------------------------------------
    def row_form(self):
        """Another row form the data loader accepts (``verl.utils.dataset.rl_rows.RowForm``), or None."""
        return None

    def prompt_messages(self, row: dict, messages: list[dict]) -> list[dict]:
        """The chat messages of a data row (default: the row's own ``prompt``)."""
        return messages

    def chat_template_kwargs(self) -> dict:
        """Extra arguments of ``tokenizer.apply_chat_template`` for prompts (e.g. ``tools``)."""
        return {}

    @classmethod
    def report_writer(cls):
        """``write(records, path, title, label, *, table, max_questions, details)`` writing the HTML
        report of validation/evaluation records, or None when the environment has none."""
        return None
