"""Format-aware exact-match reward (Search-R1's ``qa_em_format``).

A response is *well formed* when its tags follow

    <think>..</think> ( <search>..</search> <information>..</information> <think>..</think> )* <answer>..</answer>

with every tag closed in order and only whitespace between the blocks. The score then mixes answer
correctness and form (Search-R1, Jin et al. 2025, the format-reward ablation):

    EM and well formed           -> score
    EM, malformed                -> score - structure_format_score
    no EM, well formed           -> structure_format_score (+ retrieval_score if a gold answer
                                    occurs in an <information> block)
    no EM, malformed, has answer -> final_format_score
    malformed, no answer         -> 0

The answer is the last ``<answer>`` of the response outside ``<information>`` blocks
(``parsing.extract_solution``).

A response whose prompt opened the action (a forced ``<search>``/``<answer>`` prefix, passed as
``action_prefix`` with ``solution_str`` starting with that tag) is checked from that tag on: what
came before it (the ``<think>`` block, if any) was written by the prompt, not the model, so the
check starts in the state after ``</think>``.
"""

from __future__ import annotations

import re

from search_r1.envs.search_r1.parsing import ACTION_PREFIXES, extract_solution
from search_r1.qa.answers import any_in, em_check

_TAG = re.compile(r"(</?(?:think|search|information|answer)>)")
_INFORMATION_BLOCK = re.compile(r"<information>(.*?)</information>", re.DOTALL)

# (state, tag) -> next state.  States named "in_*" hold free text; the others allow whitespace only.
_TRANSITIONS = {
    ("start", "<think>"): "in_think",
    ("after_information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "after_information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}



def check_format(response: str, action_prefix: str = "") -> tuple[bool, str]:
    """Validate the tag structure of a response.

    Tags inside an ``<information>`` block are passage text, not structure, and are skipped.

    Args:
        response: the decoded response (starting with ``action_prefix`` when one is given).
        action_prefix: ``"<search>"`` or ``"<answer>"`` when the prompt opened that tag.
    Returns:
        ``(is_valid, reason)``; ``reason`` names the first offending tag or text.
    Raises:
        ValueError: ``action_prefix`` is another string, or ``response`` does not start with it.
    """
    state = "start"
    if action_prefix:
        if action_prefix not in ACTION_PREFIXES or not response.startswith(action_prefix):
            raise ValueError(f"action_prefix must be one of {ACTION_PREFIXES} and start the response; "
                             f"got {action_prefix!r} for a response starting {response[:20]!r}")
        state = "after_think"
    for part in _TAG.split(response):
        if state == "in_information" and part != "</information>":
            continue
        if _TAG.fullmatch(part):
            next_state = _TRANSITIONS.get((state, part))
            if next_state is None:
                return False, f"unexpected tag {part} in state {state}"
            state = next_state
        elif part.strip() and not state.startswith("in_"):
            return False, f"unexpected text {part.strip()[:40]!r} in state {state}"
    if state != "end":
        return False, f"incomplete sequence, ended in state {state}"
    return True, "valid"


def is_valid_sequence(response: str, action_prefix: str = "") -> bool:
    """True when :func:`check_format` accepts the response."""
    return check_format(response, action_prefix)[0]


def information_blocks(response: str) -> list[str]:
    """Contents of the closed ``<information>`` blocks of a response."""
    return _INFORMATION_BLOCK.findall(response)


def compute_score_em(solution_str: str, ground_truth, structure_format_score: float = 0.0,
                     final_format_score: float = 0.0, retrieval_score: float = 0.0,
                     format_score: float = 0.0, score: float = 1.0, action_prefix: str = "") -> float:
    """Format-aware EM score of one response (table in the module docstring).

    Args:
        solution_str: the decoded response (not the prompt).
        ground_truth: ``{"target": [...]}``, a list/array of answers, or one answer.
        structure_format_score, final_format_score, retrieval_score: the config keys
            ``reward_model.structure_format_score`` etc.
        format_score: accepted for call compatibility with ``reward.compute_score_em``; unused, as
            in Search-R1.
        score: reward for a correct, well-formed answer.
        action_prefix: the tag a forced prompt prefix opened (``solution_str`` starts with it).
    """
    del format_score
    answer = extract_solution(solution_str)
    valid = is_valid_sequence(solution_str, action_prefix)
    correct = answer is not None and em_check(answer, ground_truth)
    if correct:
        return float(score) if valid else float(score - structure_format_score)
    if valid:
        retrieved = any_in(ground_truth, information_blocks(solution_str))
        return float(structure_format_score + (retrieval_score if retrieved else 0.0))
    return float(final_format_score) if answer is not None else 0.0
