"""Text-level signals of training health in Search-R1's trajectories, one value per response.

Collapse of a Search-R1 run shows in the text before the score falls: tags left open or misnested,
``<think>`` blocks that grow and repeat themselves, answers that stop coming (a public
re-examination of Search-R1, 2026; the answer avoidance of Xu et al. 2026, arXiv:2602.19526). The
trainer averages these per step (``health/*``) and raises an alarm when one drifts from its start
(:mod:`verl.trainer.ppo.health`).

Per response (the model's text: the loop's ``<information>`` blocks and messages are removed first):

* ``broken_tags``: 1 when a ``<think>``/``<search>``/``<answer>`` tag opens inside another, closes
  one that is not open, or is left open at the end (a response cut by the length budget included);
* ``think_words``: words inside ``<think>`` blocks (an unclosed last block counts to the end);
* ``think_distinct_3gram``: distinct word 3-grams / all word 3-grams of those words (Li et al.
  2016's distinct-n; 1 = no repetition), NaN with fewer than 3 words;
* ``no_answer``: 1 when the response has no complete ``<answer>`` (answer avoidance);
* ``searches``: the searches made (:func:`~search_r1.envs.search_r1.parsing.count_searches`).
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from search_r1.envs.search_r1.parsing import count_searches, extract_solution
from search_r1.envs.search_r1.prompts import ENVIRONMENT_TEXT

_TAG = re.compile(r"<(/?)(think|search|answer)>")
_THINK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.DOTALL)
NGRAM = 3

# Alarm rules (verl.trainer.ppo.health): each signal's drift from the run's first steps.
HEALTH_RULES = {"broken_tags": ("rise", 0.2), "think_distinct_3gram": ("fall", 0.2),
                "think_words": ("grow", 3.0), "no_answer": ("rise", 0.3)}


def broken_tags(text: str) -> bool:
    """Whether the model text's tags are misnested, stray or left open."""
    open_tag = None
    for match in _TAG.finditer(text):
        closing, name = match.group(1) == "/", match.group(2)
        if closing:
            if open_tag != name:
                return True
            open_tag = None
        elif open_tag is not None:
            return True
        else:
            open_tag = name
    return open_tag is not None


def think_words(text: str) -> list[str]:
    """The words of the ``<think>`` blocks, in order."""
    return [word for block in _THINK.findall(text) for word in block.split()]


def distinct_ngram_ratio(words: Sequence[str], n: int = NGRAM) -> float:
    """Distinct n-grams / n-grams of ``words`` (NaN with fewer than ``n`` words)."""
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def health_signals(responses: Sequence[str]) -> dict[str, np.ndarray]:
    """The signals of the module docstring for decoded responses, each a float array ``(B,)``."""
    rows = {key: [] for key in ("broken_tags", "think_words", "think_distinct_3gram", "no_answer", "searches")}
    for response in responses:
        text = ENVIRONMENT_TEXT.sub(" ", response)
        words = think_words(text)
        rows["broken_tags"].append(float(broken_tags(text)))
        rows["think_words"].append(float(len(words)))
        rows["think_distinct_3gram"].append(distinct_ngram_ratio(words))
        rows["no_answer"].append(float(extract_solution(response) is None))
        rows["searches"].append(float(count_searches(response)))
    return {key: np.asarray(values, dtype=float) for key, values in rows.items()}
