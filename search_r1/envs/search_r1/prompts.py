"""Text contracts shared with Search-R1: the question prompt, passage rendering, observations.

These strings are interface constants, not style choices: checkpoints and data made with Search-R1
were trained on them byte for byte (including the "as your want" typo), so changing a character
changes what a trained model sees.

Templates (:data:`TEMPLATES`): ``base`` (Search-R1's), ``instruct`` (its grammar fixed) and ``fast``
(the "Fast Thinking" template of Xu et al. 2026, "How to Train Your Deep Research Agent?",
arXiv:2602.19526, sec. 3: the same tags and tools without the instruction to reason inside
``<think>`` before every action, which the paper reports as more stable than Search-R1's "Slow
Thinking" template). The paper's exact wording could not be read from the stored copies of the
paper; ``fast`` is Search-R1's template with that one instruction removed, the simplest reading of
its description. Any template can state the search budget (:func:`make_prefix` ``search_budget``):
"You can search at most N times." in place of "as many times as you want", a public re-examination
of Search-R1 (2026) reports the stated budget to act as a regulariser.
"""

from __future__ import annotations

import re

# Search-R1 scripts/data_process/nq_search.py, make_prefix(template_type="base").
SEARCH_R1_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> "
    "and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)

# A variant for instruct models that keeps the tags but fixes the grammar; opt-in via --template.
INSTRUCT_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search>, and it will return the top searched results between <information> and </information>. "
    "You can search as many times as you want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> "
    "and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)

# Xu et al. 2026 (arXiv:2602.19526)'s "Fast Thinking" template as described there: act directly,
# with no mandatory <think> before each action (see the module docstring).
FAST_TEMPLATE = (
    "Answer the given question. "
    "If you find you lack some knowledge, you can call a search engine by <search> query </search>, "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as you want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> "
    "and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)

TEMPLATES = {"base": SEARCH_R1_TEMPLATE, "instruct": INSTRUCT_TEMPLATE, "fast": FAST_TEMPLATE}
QUESTION_MARKER = "Question: "  # the templates' last field: the question follows it up to the line end
# The templates' sentence on how often the model may search, and what states a budget instead.
UNLIMITED_SEARCH = re.compile(r"You can search as many times as your? want\.")
BUDGET_SENTENCE = "You can search at most {budget} {times}."
_BUDGET_PATTERN = r"You can search at most \d+ times?\."

# Search-R1 search_r1/llm_agent/generation.py, the observation for an unparsable action.
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


def normalize_question(question: str) -> str:
    """Strip the question and end it with ``?`` as Search-R1's data scripts do.

    Raises:
        ValueError: the question is empty after stripping.
    """
    question = question.strip()
    if not question:
        raise ValueError("empty question")
    return question if question.endswith("?") else question + "?"


def budget_sentence(budget: int) -> str:
    """"You can search at most N times." (``time`` for 1).

    Raises:
        ValueError: ``budget`` below 1.
    """
    if budget < 1:
        raise ValueError(f"a search budget must be at least 1, got {budget}")
    return BUDGET_SENTENCE.format(budget=budget, times="time" if budget == 1 else "times")


def make_prefix(question: str, template: str = "base", search_budget: int | None = None) -> str:
    """The user-turn text for ``question`` (normalised) under a named template.

    Args:
        search_budget: state this many searches as the limit (the run's ``max_turns``) in place of
            the template's "You can search as many times as you want."; None keeps the template.
    Raises:
        ValueError: unknown template name, empty question, or a budget below 1.
    """
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {sorted(TEMPLATES)}")
    text = TEMPLATES[template]
    if search_budget is not None:
        text = UNLIMITED_SEARCH.sub(budget_sentence(search_budget), text)
    return text.format(question=normalize_question(question))


def prompt_messages(question: str, template: str = "base", search_budget: int | None = None) -> list[dict]:
    """The chat messages of a Search-R1 row: one user turn holding :func:`make_prefix`."""
    return [{"role": "user", "content": make_prefix(question, template, search_budget)}]


def _template_pattern(template: str) -> re.Pattern:
    """A template as a pattern: its question is a group, its search sentence either form."""
    head, tail = template.split("{question}")
    parts = []
    for piece in (head, tail):
        sentence = UNLIMITED_SEARCH.search(piece)
        if sentence is None:
            parts.append(re.escape(piece))
        else:
            parts.append(re.escape(piece[:sentence.start()]) + f"(?:{re.escape(sentence.group())}|{_BUDGET_PATTERN})"
                         + re.escape(piece[sentence.end():]))
    return re.compile(parts[0] + r"(?P<question>[^\n]*)" + parts[1], re.DOTALL)


_TEMPLATE_PATTERNS = {name: _template_pattern(text) for name, text in TEMPLATES.items()}


def template_of(content: str) -> tuple[str, str] | None:
    """``(template name, question)`` of a user turn written with one of :data:`TEMPLATES` (with or
    without a stated search budget), or None for other text."""
    for name, pattern in _TEMPLATE_PATTERNS.items():
        match = pattern.fullmatch(content)
        if match:
            return name, match.group("question").strip()
    return None


def question_of(prompt: str) -> str:
    """The question of a Search-R1 prompt (the text after the last ``Question: `` up to its line
    end), or the whole prompt when it has no such marker."""
    if QUESTION_MARKER not in prompt:
        return prompt.strip()
    return prompt.rsplit(QUESTION_MARKER, 1)[1].split("\n", 1)[0].strip()


def template_question(content: str) -> str | None:
    """The question of a user turn written with one of :data:`TEMPLATES`, or None for other text
    (another environment reads Search-R1's rows by their question)."""
    found = template_of(content)
    return found[1] if found is not None else None


OBSERVATION_HEAD, OBSERVATION_TAIL = "\n\n<information>", "</information>\n\n"


def format_observation(passages: str) -> str:
    """Wrap rendered passages into the observation appended after a ``</search>``.

    Search-R1 strips the rendered passages before wrapping them, so the last passage's newline is
    not inside the block.
    """
    return OBSERVATION_HEAD + passages.strip() + OBSERVATION_TAIL


# The text the search loop itself writes into a trajectory: observation blocks (format_observation;
# one cut by a budget has no closing tag) and the invalid-action message, whose own
# "<answer> and </answer>" is not an answer. The reward ignores it; SFT trains on everything else.
ENVIRONMENT_TEXT = re.compile(
    r"((?:\n\n)?<information>.*?(?:</information>(?:\n\n)?|\Z)|" + re.escape(INVALID_ACTION_MESSAGE) + ")",
    re.DOTALL)
