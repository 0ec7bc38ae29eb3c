"""Training rows from FlashRAG QA rows: the one builder of the data scripts and the data loader.

FlashRAG's QA files (the form Search-R1's data guide starts from) hold ``{"id", "question",
"golden_answers": [str, ...]}`` per row, in ``<folder>/<data_source>/<split>.jsonl``. Search-R1's
rows carry the prompt already::

    {"data_source": "nq",
     "prompt": [{"role": "user", "content": make_prefix(question)}],
     "ability": "fact-reasoning",
     "reward_model": {"style": "rule", "ground_truth": {"target": [answers]}},
     "extra_info": {"split": "train", "index": 17, "uid": "nq-train-17"}}

The prompt messages are the environment's (``Environment.row_form``): ``scripts/data_process/*``
write Search-R1's rows to parquet with :func:`make_row`; the RL data loader applies
:func:`flashrag_form` to FlashRAG rows given directly as ``data.train_files`` (JSONL or parquet), so
both routes give the same rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from search_r1.qa.answers import QA_DATA_SOURCES
from verl.utils.dataset.rl_rows import RowForm

FLASHRAG_FIELDS = ("question", "golden_answers")
DEFAULT_SOURCE = "nq"  # a QA name, so rows from any folder get the exact-match reward
Messages = Callable[[str], list[dict]]


def clean_answers(answers) -> list[str] | None:
    """Gold answers as a list of non-empty strings, or None when the field is unusable."""
    if isinstance(answers, str):
        answers = [answers]
    if hasattr(answers, "tolist"):  # numpy arrays from hub datasets / parquet
        answers = answers.tolist()
    if not isinstance(answers, (list, tuple)) or not answers:
        return None
    if not all(isinstance(a, str) and a.strip() for a in answers):
        return None
    return list(answers)


def is_well_formed(row: dict) -> bool:
    """A row needs a non-empty question and at least one non-empty answer."""
    question = row.get("question")
    return (isinstance(question, str) and bool(question.strip())
            and clean_answers(row.get("golden_answers")) is not None)


def make_row(row: dict, index: int, data_source: str, split: str, messages: Messages) -> dict:
    """One training/eval row (schema in the module docstring) from a well-formed FlashRAG row;
    ``messages(question)`` is the environment's prompt."""
    return {
        "data_source": data_source,
        "prompt": messages(row["question"]),
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule",
                         "ground_truth": {"target": clean_answers(row["golden_answers"])}},
        "extra_info": {"split": split, "index": index, "uid": f"{data_source}-{split}-{index}"},
    }


def flashrag_form(messages: Messages) -> RowForm:
    """The FlashRAG row form of an environment whose prompt is ``messages(question)``: row number
    ``position`` of file ``path`` becomes the row the data scripts build (split = the file's stem).

    ``data_source`` is the row's own field, else the folder's name when it is a FlashRAG QA source
    (FlashRAG's ``<data_source>/<split>.jsonl`` layout, as the data scripts read it), else ``nq``;
    every QA source is scored by exact match.
    """
    def build(row: dict, path: str | Path, position: int, where: str) -> dict:
        if not is_well_formed(row):
            raise ValueError(f"{where}: a FlashRAG row needs a non-empty 'question' and 'golden_answers' "
                             f"(a string or a list of strings), got {row!r:.200}")
        path = Path(path)
        folder = path.parent.name
        source = row.get("data_source") or (folder if folder in QA_DATA_SOURCES else DEFAULT_SOURCE)
        return make_row(row, position, str(source), path.stem, messages)

    return RowForm("FlashRAG", FLASHRAG_FIELDS, build)
