"""Single-turn exact-match reward for the peers of ``benchmarks/vs_peers_gpu.py`` (veRL 0.9.1, TRL 1.16).

A standalone copy of ``search_r1.envs.search_r1.reward.compute_score_em`` (SQuAD normalisation, the
last ``<answer>`` of the response, the loop's own ``<information>`` text ignored): the peers run in
sites where ``verl`` is veRL's package, so this file imports nothing of ours (only the standard
library). ``tests/benchmarks/test_vs_peers_gpu.py`` checks it scores like ours on a table of cases.

veRL loads :func:`compute_score` through ``reward.custom_reward_function.path``; TRL takes
:func:`em_reward` as a reward function (the dataset's ``target`` column is passed by name).
"""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# search_r1/envs/search_r1/prompts.py: INVALID_ACTION_MESSAGE and ENVIRONMENT_TEXT
_INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
_ENVIRONMENT_TEXT = re.compile(
    r"((?:\n\n)?<information>.*?(?:</information>(?:\n\n)?|\Z)|" + re.escape(_INVALID_ACTION_MESSAGE) + ")",
    re.DOTALL)


def normalize_answer(text: str, remove_articles: bool = True) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_DROP_PUNCTUATION)
    if remove_articles:
        text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answers(ground_truth) -> list[str]:
    """Gold answers from ``{"target": [...]}``, a list or array (``.tolist()``), or one string."""
    if isinstance(ground_truth, dict):
        ground_truth = ground_truth["target"]
    if hasattr(ground_truth, "tolist"):
        ground_truth = ground_truth.tolist()
    return [ground_truth] if isinstance(ground_truth, str) else list(ground_truth)


def em_check(prediction: str, ground_truth) -> bool:
    """Normalised equality with a gold answer; articles kept when either side is only an article."""
    for gold in answers(ground_truth):
        pred_norm, gold_norm = normalize_answer(prediction), normalize_answer(gold)
        if not (pred_norm and gold_norm):
            pred_norm, gold_norm = normalize_answer(prediction, False), normalize_answer(gold, False)
        if gold_norm and pred_norm == gold_norm:
            return True
    return False


def compute_score_em(solution_str: str, ground_truth, format_score: float = 0.0, score: float = 1.0) -> float:
    """``score`` when the last ``<answer>`` matches, ``format_score`` when it does not, 0 without one."""
    matches = _ANSWER.findall(_ENVIRONMENT_TEXT.sub(" ", solution_str))
    if not matches:
        return 0.0
    return float(score) if em_check(matches[-1].strip(), ground_truth) else float(format_score)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_) -> float:
    """veRL's custom reward signature (``verl/experimental/reward_loop/reward_manager/naive.py`` calls it
    with ``data_source``, ``solution_str``, ``ground_truth``, ``extra_info``)."""
    return compute_score_em(solution_str, ground_truth)


def em_reward(completions, target, **_) -> list[float]:
    """TRL reward function: EM of each completion's text (conversational completions: the message)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [compute_score_em(text, gold) for text, gold in zip(texts, target)]
