"""Search-R1's rewards: exact match on the last ``<answer>`` (optionally format-aware), or token F1
with action-level penalties (Search-R1++).

The answer is the text of the **last** ``<answer>...</answer>`` of the *response*. Search-R1 decoded
prompt + response and skipped the first match (the prompt's ``<answer> Beijing </answer>`` example);
here callers pass the response only, so every match counts and the last one wins. Text the loop
wrote (``<information>`` blocks, the invalid-action message) is not the model's and is ignored.

Every score comes with the answer's exact match (``em``), token F1 (``f1``), cover-EM
(``cover_em``: a gold answer contained in the answer) and ``retrieved`` (a gold answer occurs in an
``<information>`` block: the search found it, whatever the answer) as per-row extras: the evaluation
table and the ``reward_extra/*`` metrics show them whichever reward trains. ``retrieved`` beside
``em`` separates a retrieval miss from a reading miss.
"""

from __future__ import annotations

from search_r1.envs.search_r1 import reward_format
from search_r1.envs.search_r1.parsing import count_searches, extract_solution
from search_r1.qa.answers import QA_DATA_SOURCES, any_in, cover_em_check, em_check, f1_score, score_answer

_FORMAT_KEYS = ("structure_format_score", "final_format_score", "retrieval_score")


def compute_score_em(solution_str: str, ground_truth, format_score: float = 0.0,
                     score: float = 1.0) -> float:
    """EM score of a response.

    Args:
        solution_str: the decoded response (not the prompt).
        ground_truth: ``{"target": [...]}``, a list/array of answers, or one answer.
        format_score: reward for an answer that is present but wrong.
        score: reward for a correct answer.
    Returns:
        ``score`` on EM, ``format_score`` for a wrong answer, 0 with no answer.
    """
    return score_answer(extract_solution(solution_str), ground_truth, format_score, score, em_check)


def compute_score_f1(solution_str: str, ground_truth, no_answer_penalty: float = 0.0,
                     no_search_penalty: float = 0.0) -> float:
    """F1+ of Xu et al. 2026 ("How to Train Your Deep Research Agent?", arXiv:2602.19526, sec. 4).

    ``R = F1(a, gold) - alpha * 1[no search action] - beta * 1[no answer action]``: SQuAD token F1 of
    the last answer ``a`` (0 without one), minus ``alpha`` (``no_search_penalty``) when the response
    never searched and ``beta`` (``no_answer_penalty``) when it gave no ``<answer>``. The paper
    reports plain F1 (alpha = beta = 0) collapsing by answer avoidance (no answer scores what a
    wrong one does) and these action-level penalties fixing it; the stored copies of the paper did
    not show the equation itself, so the form and alpha = beta = 0.1 follow its published summaries.
    A search is a complete ``<search>q</search>`` with a non-empty query outside the loop's text.
    """
    answer = extract_solution(solution_str)
    f1 = f1_score(answer, ground_truth) if answer is not None else 0.0
    penalty = no_search_penalty * (count_searches(solution_str) == 0) + no_answer_penalty * (answer is None)
    return float(f1 - penalty)


def answer_matches(solution_str: str, ground_truth) -> dict[str, float]:
    """``em``, ``f1`` and ``cover_em`` of the response's last answer (all 0 without one)."""
    answer = extract_solution(solution_str)
    if answer is None:
        return {"em": 0.0, "f1": 0.0, "cover_em": 0.0}
    return {"em": float(em_check(answer, ground_truth)), "f1": f1_score(answer, ground_truth),
            "cover_em": float(cover_em_check(answer, ground_truth))}


def compute_score(data_source: str, solution_str: str, ground_truth, extra_info=None,
                  format_aware: bool = False, style: str = "em", **kwargs) -> dict:
    """Score one decoded response of a QA row.

    ``style="f1"``: :func:`compute_score_f1` (takes ``no_answer_penalty``, ``no_search_penalty``).
    Else ``reward_format.compute_score_em`` with ``format_aware`` (``reward_model.style=format``) or
    when any of ``structure_format_score``, ``final_format_score``, ``retrieval_score`` is
    non-zero, else plain :func:`compute_score_em` (which takes ``format_score`` and ``score``).

    Args:
        data_source: the row's ``data_source`` (e.g. ``"nq"``).
        solution_str: the decoded response, without the prompt.
        ground_truth: ``{"target": [...]}`` or the answers themselves.
        extra_info: the row's ``extra_info`` (unused by the QA scores).
        format_aware: always use the format-aware score.
        style: ``"em"`` (the two above) or ``"f1"``.
        **kwargs: score knobs named above, and ``action_prefix`` (the tag a forced prompt prefix
            opened; ``solution_str`` starts with it): the format check then starts inside it.
    Returns:
        ``{"score": reward, "em", "f1", "cover_em"}`` (:func:`answer_matches`) and ``retrieved``
        (1.0 when a gold answer occurs in one of the response's ``<information>`` blocks).
    Raises:
        NotImplementedError: ``data_source`` is not a QA set.
    """
    del extra_info
    if data_source not in QA_DATA_SOURCES:
        raise NotImplementedError(
            f"no reward function for data_source {data_source!r}; known: {sorted(QA_DATA_SOURCES)}")
    if style == "f1":
        penalties = {key: kwargs[key] for key in ("no_answer_penalty", "no_search_penalty") if key in kwargs}
        score = compute_score_f1(solution_str, ground_truth, **penalties)
    elif format_aware or any(kwargs.get(key) for key in _FORMAT_KEYS):
        score = reward_format.compute_score_em(solution_str, ground_truth, **kwargs)
    else:
        plain = {key: kwargs[key] for key in ("format_score", "score") if key in kwargs}  # EM needs no prefix rule
        score = compute_score_em(solution_str, ground_truth, **plain)
    retrieved = any_in(ground_truth, reward_format.information_blocks(solution_str))
    return {"score": score, **answer_matches(solution_str, ground_truth), "retrieved": float(retrieved)}
