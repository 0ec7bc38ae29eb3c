"""Parse the action a model wrote in one turn: ``<search>q</search>`` or ``<answer>a</answer>``.

The first *complete* tag pair in the turn's new text wins (Search-R1's regex
``<(search|answer)>(.*?)</\\1>`` with DOTALL). Unlike Search-R1, an empty or whitespace-only query
is an invalid action (the model gets the corrective message instead of an empty retrieval).
The ``<think>`` blocks the prompt asks for are not parsed by the loop; :func:`split_reasoning`
reads them for the trajectory report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from search_r1.envs.search_r1.prompts import ENVIRONMENT_TEXT

ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
STOP_STRINGS = ("</search>", "</answer>")
ACTION_PREFIXES = ("<search>", "<answer>")  # the tags a prompt may open (a forced assistant prefix)
THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class Action:
    """``kind`` is ``"search"``, ``"answer"`` or ``None`` (invalid); ``content`` is stripped."""

    kind: Literal["search", "answer"] | None
    content: str = ""

    @property
    def valid(self) -> bool:
        return self.kind is not None


def parse_action(text: str) -> Action:
    """The first complete ``<search>``/``<answer>`` pair of ``text``; empty queries are invalid."""
    match = ACTION_RE.search(text)
    if match is None:
        return Action(None)
    kind, content = match.group(1), match.group(2).strip()
    if kind == "search" and not content:
        return Action(None)
    return Action(kind, content)  # type: ignore[arg-type]


def split_reasoning(text: str) -> tuple[list[str], str]:
    """The ``<think>`` blocks of a turn's text and what is written outside them.

    Args:
        text: a turn's generated text before its action.
    Returns:
        ``(blocks, rest)``: each closed block's content stripped, in order; ``rest`` the text
        outside the blocks, stripped (``""`` for a well-formed turn; an unclosed ``<think>`` stays
        in it).
    """
    blocks = [block.strip() for block in THINK_RE.findall(text)]
    return blocks, THINK_RE.sub(" ", text).strip()


def count_searches(response: str) -> int:
    """The searches a response made: complete ``<search>q</search>`` with a non-empty query, in the
    model's text (the loop's ``<information>`` blocks and messages are not the model's)."""
    text = ENVIRONMENT_TEXT.sub(" ", response)
    return sum(1 for kind, content in ACTION_RE.findall(text) if kind == "search" and content.strip())


def extract_solution(response: str) -> str | None:
    """Stripped text of the last complete ``<answer>...</answer>`` of a response, or None.

    Text the search loop wrote (``<information>`` blocks, the invalid-action message) is ignored:
    those are not the model's words.
    """
    matches = _ANSWER.findall(ENVIRONMENT_TEXT.sub(" ", response))
    if not matches:
        return None
    return matches[-1].strip()
