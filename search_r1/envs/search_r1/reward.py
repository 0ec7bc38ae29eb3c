"""Search-R1's rewards: exact match on the last ``<answer>``, optionally format-aware.

The answer is the text of the **last** ``<answer>...</answer>`` of the *response*. Search-R1 decoded
prompt + response and skipped the first match (the prompt's ``<answer> Beijing </answer>`` example);
here callers pass the response only, so every match counts and the last one wins. Text the loop
wrote (``<information>`` blocks, the invalid-action message) is not the model's and is ignored.
"""

from __future__ import annotations

from search_r1.envs.search_r1 import reward_format
from search_r1.envs.search_r1.parsing import extract_solution
from search_r1.qa.answers import QA_DATA_SOURCES, em_check, score_answer

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




def compute_score(data_source: str, solution_str: str, ground_truth, extra_info=None,
                  format_aware: bool = False, **kwargs) -> dict:
    """Score one decoded response of a QA row.

    ``reward_format.compute_score_em`` with ``format_aware`` (``reward_model.style=format``) or
    when any of ``structure_format_score``, ``final_format_score``, ``retrieval_score`` is
    non-zero, else plain :func:`compute_score_em` (which takes ``format_score`` and ``score``).

    Args:
        data_source: the row's ``data_source`` (e.g. ``"nq"``).
        solution_str: the decoded response, without the prompt.
        ground_truth: ``{"target": [...]}`` or the answers themselves.
        extra_info: the row's ``extra_info`` (unused by the QA scores).
        format_aware: always use the format-aware score.
        **kwargs: score knobs named above, and ``action_prefix`` (the tag a forced prompt prefix
            opened; ``solution_str`` starts with it): the format check then starts inside it.
    Returns:
        ``{"score": reward, "em": exact match of the answer (0/1)}``.
    Raises:
        NotImplementedError: ``data_source`` is not a QA set.
    """
    del extra_info
    if data_source not in QA_DATA_SOURCES:
        raise NotImplementedError(
            f"no reward function for data_source {data_source!r}; known: {sorted(QA_DATA_SOURCES)}")
    if format_aware or any(kwargs.get(key) for key in _FORMAT_KEYS):
        score = reward_format.compute_score_em(solution_str, ground_truth, **kwargs)
    else:
        plain = {key: kwargs[key] for key in ("format_score", "score") if key in kwargs}  # EM needs no prefix rule
        score = compute_score_em(solution_str, ground_truth, **plain)
    return {"score": score, "em": compute_score_em(solution_str, ground_truth)}
