"""A record's trajectory read back turn by turn, and the gold answers marked in its passages."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from search_r1.envs.search_r1.prompts import INVALID_ACTION_MESSAGE
from search_r1.report.trajectory import action_prefix, gold_spans, parse_turns, segments
from search_r1.qa.answers import em_check, normalize_answer

from .helpers import observation

REPO = Path(__file__).resolve().parents[2]


def test_turns_follow_the_environments_text():
    output = ("<think>I should search.</think>\n<search> daisy duke </search>"
              + observation(("Dukes", "Jessica Simpson played Daisy."), ("Bach", "Catherine Bach"))
              + "oops </search>" + INVALID_ACTION_MESSAGE
              + "<search> second </search>" + observation()  # do_search=False: an empty block
              + "<think>a</think><think>b</think> stray <answer> Jessica Simpson </answer>")
    turns = parse_turns(output, ["Jessica Simpson"])
    assert [(t.action, t.content, t.observation) for t in turns] == [
        ("search", "daisy duke", "passages"), (None, "", "invalid"), ("search", "second", "empty"),
        ("answer", "Jessica Simpson", None)]
    first = turns[0]
    assert first.reasoning == ["I should search."] and first.outside == ""
    assert [(d.rank, d.title, d.text) for d in first.documents] == [
        (1, '"Dukes"', "Jessica Simpson played Daisy."), (2, '"Bach"', "Catherine Bach")]
    assert first.documents[0].has_gold and not first.documents[1].has_gold
    assert first.documents[0].text_gold == [(0, len("Jessica Simpson"))]
    assert turns[1].text == "oops </search>"  # an invalid turn keeps its text as written
    assert turns[3].reasoning == ["a", "b"] and turns[3].outside == "stray"


def test_a_turn_that_ran_out_and_a_forced_prefix():
    cut = parse_turns("<think>I will keep thinking and never")
    assert len(cut) == 1 and cut[0].action is None and cut[0].text.endswith("never")
    prompt = "Question: who?\n<|im_start|>assistant\n<answer>"
    assert action_prefix(prompt) == "<answer>" and action_prefix("Question: who?\n") == ""
    turns = parse_turns(" Paris </answer>", prefix=action_prefix(prompt))
    assert [(t.action, t.content) for t in turns] == [("answer", "Paris")]


@pytest.mark.parametrize("text, golds, marked", [
    ("songs by the Beatles, 1969", ["The Beatles"], ["Beatles,"]),    # articles and punctuation dropped
    ("a comparison of cities", ["Paris"], []),                        # whole words only
    ("born in the U.S.A. in 1950", ["usa"], ["U.S.A."]),
    ("(Jessica Simpson) sang", ["jessica simpson"], ["(Jessica Simpson)"]),
    ("vitamin A and a cat", ["A"], ["A", "a"]),                      # an article-only answer keeps articles
    ("New York City, New York", ["New York", "York City"], ["New York City,", "New York"]),  # overlaps merged
    ("Zurich or Zürich", ["Zürich"], ["Zürich"]),                     # no accent folding, as EM
])
def test_gold_spans_are_what_exact_match_accepts(text, golds, marked):
    spans = gold_spans(text, golds)
    assert [text[start:end] for start, end in spans] == marked
    pieces = segments(text, spans)
    assert "".join(pieces) == text and pieces[1::2] == marked


def test_gold_spans_agree_with_em_check_on_the_example_corpus():
    """On real passages and gold answers: every run of up to 5 whole words that exact-matches a gold
    answer is marked (but for words at its ends that normalise to nothing: "the" of "the States"),
    and every marked word belongs to such a run."""
    corpus = [json.loads(line)["contents"] for line in (REPO / "example" / "corpus.jsonl").open()][:100]
    golds = sorted({g for path in (REPO / "example" / "qa").glob("*/test.jsonl")
                    for row in map(json.loads, path.open()) for g in row["golden_answers"]})
    marked_words = 0
    for text in corpus:
        normal = normalize_answer(text, False)
        present = [g for g in golds if normalize_answer(g, False) and normalize_answer(g, False) in normal]
        spans = gold_spans(text, present)
        words = list(re.finditer(r"\S+", text))
        matches = [(words[i].start(), words[j].end()) for i in range(len(words))
                   for j in range(i, min(i + 5, len(words))) if em_check(text[words[i].start():words[j].end()], present)]
        for start, end in matches:
            kept = [w for w in re.finditer(r"\S+", text[start:end]) if normalize_answer(w.group())] or \
                [w for w in re.finditer(r"\S+", text[start:end]) if normalize_answer(w.group(), False)]
            core = (start + kept[0].start(), start + kept[-1].end())
            assert any(a <= core[0] and core[1] <= b for a, b in spans), text[start:end]
        for word in words:
            if any(a <= word.start() and word.end() <= b for a, b in spans):
                marked_words += 1
                assert any(a <= word.start() and word.end() <= b for a, b in matches), (word.group(), text)
    assert marked_words > 20  # the corpus holds gold answers of its questions
