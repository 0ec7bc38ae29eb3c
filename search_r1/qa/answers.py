"""Answer matching for open-domain QA, as in Search-R1 (and DPR/FlashRAG evaluation).

Normalisation is SQuAD's (Rajpurkar et al., 2016, official evaluation script): lower-case, drop
punctuation, drop the articles a/an/the, collapse whitespace. Three matches of a prediction against
the gold answers, each the best over the gold answers:

* exact match (:func:`em_check`): the normalised strings are equal;
* cover-EM (:func:`subem_check`, FlashRAG's ``sub_em``): a normalised gold answer occurs inside the
  normalised prediction;
* token F1 (:func:`f1_score`, SQuAD's): the harmonic mean of precision and recall of the
  prediction's normalised words against the gold answer's (a bag of words).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable, Sequence

import numpy as np

# The open-domain QA sets of Search-R1's training and evaluation (FlashRAG names).
QA_DATA_SOURCES = frozenset(
    ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"])

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str, remove_articles: bool = True) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = text.translate(_DROP_PUNCTUATION)
    if remove_articles:
        text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _comparable(prediction: str, gold: str) -> tuple[str, str]:
    """Normalised (prediction, gold); articles are kept when either side is *only* an article.

    Plain SQuAD normalisation maps "A" (e.g. "Vitamin A" questions answered "A") and an empty
    answer to the same "" and would reward ``<answer></answer>``; keeping the articles for such
    pairs keeps "a" == "A" while "" matches nothing.
    """
    pred_norm, gold_norm = normalize_answer(prediction), normalize_answer(gold)
    if pred_norm and gold_norm:
        return pred_norm, gold_norm
    return normalize_answer(prediction, False), normalize_answer(gold, False)


def as_answer_list(golden_answers) -> list[str]:
    """Gold answers as a list of strings; accepts a str, a list/tuple, or a numpy array.

    A ``{"target": [...]}`` mapping (the ``reward_model.ground_truth`` field) is unwrapped too. A
    0-d array (``np.array("Beijing", dtype=object)``) is one answer: its ``tolist()`` is the bare
    string, which must not be iterated into characters.

    Raises:
        ValueError: a gold answer is not a string.
    """
    if isinstance(golden_answers, dict):
        golden_answers = golden_answers["target"]
    if isinstance(golden_answers, np.ndarray):
        golden_answers = golden_answers.tolist()
    if isinstance(golden_answers, str):
        return [golden_answers]
    answers = list(golden_answers)
    for answer in answers:
        if not isinstance(answer, str):
            raise ValueError(f"gold answer {answer!r} is not a string (in {answers!r})")
    return answers


def em_check(prediction: str, golden_answers) -> int:
    """1 when the normalised prediction equals a normalised gold answer, else 0."""
    for gold in as_answer_list(golden_answers):
        pred_norm, gold_norm = _comparable(prediction, gold)
        if gold_norm and pred_norm == gold_norm:
            return 1
    return 0


def subem_check(prediction: str, golden_answers) -> int:
    """1 when a normalised gold answer occurs inside the normalised prediction, else 0.

    A gold answer that is only an article (``"A"``) must occur as a whole word; an empty gold
    answer never matches (it would be a substring of everything).
    """
    for gold in as_answer_list(golden_answers):
        if normalize_answer(gold):
            if normalize_answer(gold) in normalize_answer(prediction):
                return 1
            continue
        gold_words = normalize_answer(gold, remove_articles=False)
        if gold_words and f" {gold_words} " in f" {normalize_answer(prediction, False)} ":
            return 1
    return 0


def cover_em_check(prediction: str, golden_answers) -> int:
    """Cover-EM: 1 when a gold answer is contained in the normalised prediction (:func:`subem_check`)."""
    return subem_check(prediction, golden_answers)


def f1_score(prediction: str, golden_answers) -> float:
    """SQuAD token F1 of ``prediction``, the best over the gold answers.

    Per gold answer ``g``: with ``common`` the multiset intersection of the normalised words of the
    prediction ``p`` and of ``g``, ``precision = |common| / |p|``, ``recall = |common| / |g|`` and
    ``F1 = 2 * precision * recall / (precision + recall)`` (0 when nothing is shared). A gold
    answer that is only an article is compared with the articles kept (as :func:`em_check`); a
    prediction that normalises to nothing scores 0.
    """
    best = 0.0
    for gold in as_answer_list(golden_answers):
        keep_articles = not normalize_answer(gold)
        pred_words = normalize_answer(prediction, not keep_articles).split()
        gold_words = normalize_answer(gold, not keep_articles).split()
        if not pred_words or not gold_words:
            continue
        same = sum((Counter(pred_words) & Counter(gold_words)).values())
        if same:
            precision, recall = same / len(pred_words), same / len(gold_words)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def any_in(golden_answers: Sequence[str], texts: Iterable[str]) -> bool:
    """True when a non-empty normalised gold answer occurs in one of the normalised texts."""
    golds = [g for g in (normalize_answer(a) for a in as_answer_list(golden_answers)) if g]
    if not golds:
        return False
    return any(gold in normalized for normalized in map(normalize_answer, texts) for gold in golds)


def score_answer(answer: str | None, ground_truth, format_score: float = 0.0, score: float = 1.0,
                 match=em_check) -> float:
    """``score`` when ``answer`` matches (``match``: :func:`em_check` or :func:`subem_check`),
    ``format_score`` for a wrong answer, 0 with no answer (None)."""
    if answer is None:
        return 0.0
    return float(score) if match(answer, ground_truth) else float(format_score)
