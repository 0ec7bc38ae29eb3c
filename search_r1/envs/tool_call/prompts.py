"""The tool_call environment's text: the search tool's schema, the prompt, the call and answer syntax.

The model calls the search tool the way instruct models trained on Hermes/Qwen2.5 tool use do::

    <tool_call>
    {"name": "search", "arguments": {"query": "..."}}
    </tool_call>

and gives its final answer inside ``<answer>`` and ``</answer>`` (scored by exact match, as in
Search-R1). A tokenizer whose chat template takes ``tools`` (Qwen2.5, Qwen3) describes the tool
itself; for one that does not (SmolLM2), :data:`TOOL_SYSTEM_TEXT` describes it in the system turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

from search_r1.envs.search_r1.prompts import normalize_question

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search a Wikipedia index; returns the top passages for the query.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to look up"}},
            "required": ["query"],
        },
    },
}

SYSTEM_TEXT = (
    "Answer the given question. Think inside <think> and </think> before each step. When you lack "
    "some knowledge, call the search tool; its results come back as a tool response. You can search "
    "as many times as you need. When no further search is needed, give the final answer inside "
    "<answer> and </answer>, without explanation, for example <answer> Beijing </answer>."
)

# For chat templates without tool support: the tool described in the system turn.
TOOL_SYSTEM_TEXT = (
    SYSTEM_TEXT + "\n\nTo call the search tool, write one JSON object with the function name and its "
    "arguments inside <tool_call></tool_call> tags:\n<tool_call>\n"
    + json.dumps({"name": "search", "arguments": {"query": "your query"}}) + "\n</tool_call>\n\n"
    "The tool:\n" + json.dumps(SEARCH_TOOL)
)

STOP_STRINGS = ("</tool_call>", "</answer>")
ACTION_PREFIXES = ("<tool_call>", "<answer>")  # the tags a prompt may open (a forced assistant prefix)
ACTION_RE = re.compile(r"<(tool_call|answer)>(.*?)</\1>", re.DOTALL)
TOOL_RESPONSE_TEXT = re.compile(r"<tool_response>.*?(?:</tool_response>|\Z)", re.DOTALL)


def prompt_messages(question: str, template_has_tools: bool) -> list[dict]:
    """System turn (describing the tool unless the template does) and the question as the user turn.

    Raises:
        ValueError: an empty question.
    """
    system = SYSTEM_TEXT if template_has_tools else TOOL_SYSTEM_TEXT
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"Question: {normalize_question(question)}\n"}]


@dataclass(frozen=True)
class ParsedTurn:
    """``kind``: ``"search"`` (``content`` the query), ``"answer"`` (the answer) or None (invalid:
    ``content`` says why)."""

    kind: Optional[str]
    content: str


def parse_turn(text: str) -> ParsedTurn:
    """The first complete ``<tool_call>`` or ``<answer>`` of a turn's text.

    A tool call must be one JSON object ``{"name": "search", "arguments": {"query": <non-empty
    string>}}``; anything else (malformed JSON, another name, no query) is an invalid action whose
    ``content`` names what was wrong.
    """
    match = ACTION_RE.search(text)
    if match is None:
        return ParsedTurn(None, "no <tool_call> or <answer> in the turn")
    tag, body = match.group(1), match.group(2).strip()
    if tag == "answer":
        return ParsedTurn("answer", body)
    try:
        call = json.loads(body)
    except json.JSONDecodeError as error:
        return ParsedTurn(None, f"the tool call is not valid JSON ({error.msg} at column {error.colno})")
    if not isinstance(call, dict) or call.get("name") != "search":
        return ParsedTurn(None, 'the tool call must be {"name": "search", "arguments": {"query": ...}}')
    arguments = call.get("arguments")
    query = arguments.get("query") if isinstance(arguments, dict) else None
    if not isinstance(query, str) or not query.strip():
        return ParsedTurn(None, "the search call needs a non-empty string argument 'query'")
    return ParsedTurn("search", query.strip())


def invalid_text(reason: str) -> str:
    """The tool response to an invalid call."""
    return (f"Error: {reason}. Call the tool as <tool_call>\n"
            + json.dumps({"name": "search", "arguments": {"query": "..."}})
            + "\n</tool_call> or give the final answer inside <answer> and </answer>.")


def last_answer(response: str) -> Optional[str]:
    """The stripped text of the last ``<answer>...</answer>`` outside tool responses, or None."""
    answers = re.findall(r"<answer>(.*?)</answer>", TOOL_RESPONSE_TEXT.sub(" ", response), re.DOTALL)
    return answers[-1].strip() if answers else None
