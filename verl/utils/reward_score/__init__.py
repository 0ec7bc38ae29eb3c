"""Rule-based scores for rollouts, chosen by the row's ``data_source``."""

from __future__ import annotations

from verl.utils.reward_score import qa_em, qa_em_format

# The open-domain QA sets of Search-R1's training and evaluation (FlashRAG names).
QA_DATA_SOURCES = frozenset(
    ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"])

_FORMAT_KEYS = ("structure_format_score", "final_format_score", "retrieval_score")


def default_compute_score(data_source: str, solution_str: str, ground_truth, extra_info=None,
                          format_aware: bool = False, **kwargs) -> float:
    """Score one decoded response.

    QA sources use exact match on the last ``<answer>``: ``qa_em_format`` with ``format_aware``
    (``reward_model.style=format``) or when any of ``structure_format_score``,
    ``final_format_score``, ``retrieval_score`` is non-zero, else plain ``qa_em`` (which takes
    ``format_score`` and ``score``).

    Args:
        data_source: the row's ``data_source`` (e.g. ``"nq"``).
        solution_str: the decoded response, without the prompt.
        ground_truth: ``{"target": [...]}`` or the answers themselves.
        extra_info: the row's ``extra_info`` (unused by the QA scores).
        format_aware: always use the format-aware score.
        **kwargs: score knobs named above, and ``action_prefix`` (the tag a forced prompt prefix
            opened; ``solution_str`` starts with it): the format check then starts inside it.
    Raises:
        NotImplementedError: no score is registered for ``data_source``.
    """
    del extra_info
    if data_source not in QA_DATA_SOURCES:
        raise NotImplementedError(
            f"no reward function for data_source {data_source!r}; known: {sorted(QA_DATA_SOURCES)}")
    if format_aware or any(kwargs.get(key) for key in _FORMAT_KEYS):
        return qa_em_format.compute_score_em(solution_str, ground_truth, **kwargs)
    plain = {key: kwargs[key] for key in ("format_score", "score") if key in kwargs}  # EM needs no prefix rule
    return qa_em.compute_score_em(solution_str, ground_truth, **plain)


__all__ = ["QA_DATA_SOURCES", "default_compute_score", "qa_em", "qa_em_format"]
