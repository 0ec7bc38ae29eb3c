"""One record's trajectory read back turn by turn, with the environment's own parsing.

A record's ``output`` is generated text and environment text in turn order. The environment's
text (``search_r1.envs.search_r1.prompts.ENVIRONMENT_TEXT``: ``<information>`` blocks and the invalid-action
message) separates the turns; each generated stretch is one turn, parsed as the loop parsed it
(``parsing.parse_action``: the first complete ``<search>``/``<answer>`` pair; ``split_reasoning``:
the ``<think>`` blocks before it). An ``<information>`` block is split into its documents
(``prompts.parse_passages``).

Gold answers are marked where a run of whole words normalises (``qa.answers.normalize_answer``, the EM
reward's SQuAD normalisation, articles kept only for an article-only answer as ``em_check`` does)
to a gold answer: a span that EM would score as that answer. Unlike the format reward's
``retrieval_score`` (``qa.answers.any_in``, a substring test), "Paris" is not found in "comparison".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from search_r1.envs.search_r1.parsing import ACTION_PREFIXES, ACTION_RE, parse_action, split_reasoning
from search_r1.envs.search_r1.prompts import ENVIRONMENT_TEXT, INVALID_ACTION_MESSAGE
from search_r1.search.passages import parse_passages
from search_r1.qa.answers import normalize_answer

_WORD = re.compile(r"\S+")  # normalize_answer splits on whitespace; so do the spans
_BLOCK = re.compile(r"<information>(.*?)(?:</information>|\Z)", re.DOTALL)  # a cut block has no closing tag


@dataclass
class Document:
    """A retrieved passage: ``rank`` from 1, ``title`` and ``text`` as rendered, and the character
    spans of each that hold a gold answer."""

    rank: int
    title: str
    text: str
    title_gold: list[tuple[int, int]] = field(default_factory=list)
    text_gold: list[tuple[int, int]] = field(default_factory=list)

    @property
    def has_gold(self) -> bool:
        return bool(self.title_gold or self.text_gold)


@dataclass
class Turn:
    """One generation and what the environment appended after it.

    ``text``: the generated text as written; ``reasoning``: its ``<think>`` blocks before the
    action; ``outside``: other text before the action (empty when well formed); ``action``:
    ``"search"``, ``"answer"`` or None (no valid action: invalid, or the generation ran out);
    ``content``: the query or answer; ``observation``: ``"passages"``, ``"empty"`` (an empty
    ``<information>`` block), ``"invalid"`` (the corrective message) or None (nothing appended:
    the row ended).
    """

    text: str
    reasoning: list[str]
    outside: str
    action: str | None
    content: str
    observation: str | None = None
    documents: list[Document] = field(default_factory=list)


def action_prefix(prompt: str) -> str:
    """``<search>``/``<answer>`` when the decoded prompt itself opens that tag (a forced prefix),
    else ``""`` (as the generation manager decides it)."""
    return next((tag for tag in ACTION_PREFIXES if prompt.endswith(tag)), "")


def parse_turns(output: str, golds: Sequence[str] = (), prefix: str = "") -> list[Turn]:
    """The turns of a trajectory.

    Args:
        output: the decoded response (a record's ``output``).
        golds: gold answers to mark in the documents.
        prefix: the tag the prompt opened (:func:`action_prefix`); the first turn is read as its
            continuation, as the loop read it.
    Returns:
        one :class:`Turn` per generation, in order (a trailing empty generation is dropped).
    """
    parts = ENVIRONMENT_TEXT.split(prefix + output)  # generated, environment, generated, ...
    turns = []
    for index in range(0, len(parts), 2):
        text = parts[index]
        if index == len(parts) - 1 and not text.strip() and turns:
            break
        turn = _turn(text)
        if index + 1 < len(parts):
            _observe(turn, parts[index + 1], golds)
        turns.append(turn)
    return turns


def _turn(text: str) -> Turn:
    action = parse_action(text)
    match = ACTION_RE.search(text) if action.valid else None
    before = text[:match.start()] if match else text
    reasoning, outside = split_reasoning(before)
    return Turn(text=text, reasoning=reasoning, outside=outside, action=action.kind, content=action.content)


def _observe(turn: Turn, environment: str, golds: Sequence[str]) -> None:
    if environment == INVALID_ACTION_MESSAGE:
        turn.observation = "invalid"
        return
    match = _BLOCK.search(environment)
    block = match.group(1) if match else ""
    documents = [Document(rank, title, text, gold_spans(title, golds), gold_spans(text, golds))
                 for rank, title, text in parse_passages(block)]
    turn.observation, turn.documents = ("passages" if documents else "empty"), documents


def _words(text: str, remove_articles: bool) -> list[tuple[str, int, int]]:
    """Normalised words of ``text`` with the character span of the word each came from."""
    return [(word, match.start(), match.end()) for match in _WORD.finditer(text)
            for word in normalize_answer(match.group(), remove_articles).split()]


def gold_spans(text: str, golds: Sequence[str]) -> list[tuple[int, int]]:
    """Character spans of ``text`` whose words normalise to one of ``golds`` (sorted, merged).

    Word by word the normalisation equals ``normalize_answer`` of the whole span (it removes
    characters and whole words only), so a span is marked exactly when ``em_check(span, golds)``
    would hold for it.
    """
    spans = []
    for remove_articles in (True, False):
        # em_check keeps the articles only for an answer that is nothing but an article ("A")
        targets = [normalize_answer(gold, remove_articles).split() for gold in golds
                   if bool(normalize_answer(gold)) == remove_articles]
        # a run of words equal to a target is a substring of the whole normalised text: most
        # passages hold no gold answer, and one normalisation of the whole text tells
        normal = normalize_answer(text, remove_articles)
        targets = [target for target in targets if target and " ".join(target) in normal]
        if not targets:
            continue
        words = _words(text, remove_articles)
        tokens = [word for word, _, _ in words]
        for target in targets:
            size = len(target)
            spans += [(words[i][1], words[i + size - 1][2]) for i in range(len(tokens) - size + 1)
                      if tokens[i:i + size] == target]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def segments(text: str, spans: list[tuple[int, int]]) -> list[str]:
    """``text`` cut at ``spans``: plain, marked, plain, ... (even indices plain, odd marked)."""
    out, position = [], 0
    for start, end in spans:
        out += [text[position:start], text[start:end]]
        position = end
    return out + [text[position:]]
