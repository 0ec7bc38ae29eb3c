"""The tool_call environment: the chat template's own tool calls against the same retriever.

Users who retrain Search-R1 on instruct models often use their model's tool-calling format instead
of Search-R1's tags (veRL's tool agent loop). Here the prompt is a chat with a system turn and the
question, rendered with ``tools=[search]`` when the template takes tools (``prompts.py``); a turn
ends at ``</tool_call>`` or ``</answer>``. A tool call's passages come back as a tool turn exactly
as the tokenizer's chat template renders it after an assistant turn (Qwen2.5:
``<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``),
so a trajectory's text is the chat template's rendering of the conversation; a template that does
not wrap tool turns gets the ``<tool_response>`` wrapper inside the turn. A malformed call (bad
JSON, another tool, no query) gets an error as the tool's answer, never a crash. The reward is
exact match on the last ``<answer>`` outside tool responses, as in Search-R1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

from search_r1.envs.observation import ObservationEncoder
from search_r1.envs.search_r1.prompts import question_of, template_question
from search_r1.envs.search_tool import SEARCH_COUNTERS, SearchEnvironment, SearchRunConfig, SearchTool, search_metrics
from search_r1.envs.tool_call import prompts
from search_r1.qa.answers import QA_DATA_SOURCES, cover_em_check, em_check, f1_score, score_answer
from search_r1.qa.rows import flashrag_form
from verl.envs import Action, Observation, ending_tag, register_environment
from verl.workers.reward_manager.config import RewardModelConfig


@dataclass(frozen=True)
class ToolCallConfig(SearchRunConfig):
    """A run in the tool_call environment (``env.name=tool_call``): the retriever and ``do_search``
    of Search-R1's tree, the exact-match reward."""

    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """the exact-match reward on the last `<answer>`"""


def tool_turn(tokenizer, tools: list | None) -> tuple[str, str]:
    """The text the chat template puts before and after a tool turn's content that follows an
    assistant turn, up to the next assistant header.

    Raises:
        ValueError: the tokenizer has no chat template, or it renders no tool turn.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("env.name=tool_call needs a tokenizer with a chat template (the tool turns are its own)")
    said, answer = "\x00ASSISTANT\x00", "\x00TOOL\x00"
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": said}]
    kwargs = {"tools": tools} if tools else {}
    rendered = tokenizer.apply_chat_template(chat + [{"role": "tool", "content": answer}], tokenize=False,
                                             add_generation_prompt=True, **kwargs)
    # What follows the assistant's text (text before it may render otherwise, e.g. Qwen3's empty
    # <think> block on a last assistant turn, which the model never writes here).
    delta = rendered[rendered.index(said) + len(said):]
    if answer not in delta:
        raise ValueError("the chat template renders no tool turn after an assistant turn")
    head, tail = delta.split(answer)
    if "<tool_response>" not in head:
        head, tail = head + "<tool_response>\n", "\n</tool_response>" + tail
    return head, tail


@register_environment
class ToolCallEnvironment(SearchEnvironment):
    """Search through the chat template's tool calls (``env.name=tool_call``).

    Args:
        tokenizer: the policy's tokenizer (with a chat template).
        tool: the :class:`~search_r1.envs.search_tool.SearchTool`.
        max_obs_length: token budget of one tool turn, its chat scaffolding included.
    Raises:
        ValueError: no chat template, or ``max_obs_length`` leaves no room inside a tool turn.
    """

    name = "tool_call"
    config_class = ToolCallConfig
    environment_text = prompts.TOOL_RESPONSE_TEXT
    counters = SEARCH_COUNTERS
    data_sources = QA_DATA_SOURCES

    def __init__(self, tokenizer, tool: SearchTool, max_obs_length: int) -> None:
        super().__init__(tokenizer)
        self.tool = tool
        self.template_has_tools = "tools" in (tokenizer.chat_template or "")
        head, tail = tool_turn(tokenizer, [prompts.SEARCH_TOOL] if self.template_has_tools else None)
        self.observations = ObservationEncoder(tokenizer, max_obs_length, head, tail)
        self.max_concurrent_calls = tool.max_concurrency

    @classmethod
    def from_config(cls, config: ToolCallConfig, tokenizer) -> "ToolCallEnvironment":
        return cls(tokenizer, SearchTool.from_config(config), config.data.max_obs_length)

    @classmethod
    def check_ready(cls, config: ToolCallConfig) -> None:
        SearchTool.check_ready(config)

    @classmethod
    def describe(cls, config: ToolCallConfig) -> dict:
        return SearchTool.describe(config)

    # ---- the turns ------------------------------------------------------------------------------
    @property
    def stop_strings(self) -> tuple[str, ...]:
        return prompts.STOP_STRINGS

    def open_tag(self, prompt_ids: Sequence[int]) -> str:
        """``<tool_call>``/``<answer>`` when the prompt itself opens the action (a forced assistant prefix)."""
        return ending_tag(self.tokenizer, prompt_ids, prompts.ACTION_PREFIXES)

    def parse(self, text: str) -> Action:
        turn = prompts.parse_turn(text)
        counts = {"valid_action": int(turn.kind is not None), "valid_search": int(turn.kind == "search")}
        kind = {"search": "call", "answer": "final"}.get(turn.kind)
        return Action(kind, turn.content, counts)

    def invalid(self, action: Action) -> Observation:
        return Observation(self.observations.wrap(prompts.invalid_text(action.content))[0])

    # ---- scoring and reading trajectories ---------------------------------------------------------
    def compute_score(self, data_source: str, solution_str: str, ground_truth, extra_info=None, **kwargs) -> dict:
        """Exact match of the last ``<answer>`` (1 or 0), as ``score`` and ``em``, with the answer's
        token F1 (``f1``) and cover-EM (``cover_em``) beside them.

        Raises:
            NotImplementedError: ``data_source`` is not a QA set.
        """
        if data_source not in QA_DATA_SOURCES:
            raise NotImplementedError(
                f"no reward function for data_source {data_source!r}; known: {sorted(QA_DATA_SOURCES)}")
        answer = prompts.last_answer(solution_str)
        em = score_answer(answer, ground_truth, match=em_check)
        f1 = f1_score(answer, ground_truth) if answer is not None else 0.0
        return {"score": em, "em": em, "f1": f1, "cover_em": score_answer(answer, ground_truth, match=cover_em_check)}

    def extract_answer(self, response: str) -> Optional[str]:
        return prompts.last_answer(response)

    def question_of(self, prompt: str) -> str:
        return question_of(prompt)

    @classmethod
    def metrics(cls, stats: Mapping[str, Optional[np.ndarray]], prefix: str = "env") -> dict[str, float]:
        return search_metrics(stats, prefix)

    # ---- data ------------------------------------------------------------------------------------
    def messages(self, question: str) -> list[dict]:
        return prompts.prompt_messages(question, self.template_has_tools)

    def row_form(self):
        return flashrag_form(self.messages)

    def prompt_messages(self, row: dict, messages: list[dict]) -> list[dict]:
        """A Search-R1 row (its template's user turn) is asked with this environment's prompt."""
        if len(messages) == 1:
            question = template_question(str(messages[0].get("content", "")))
            if question is not None:
                return self.messages(question)
        return messages

    def chat_template_kwargs(self) -> dict:
        return {"tools": [prompts.SEARCH_TOOL]} if self.template_has_tools else {}
