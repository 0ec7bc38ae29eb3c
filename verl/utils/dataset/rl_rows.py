"""Rows of RL data files, parquet or JSONL by extension, checked against Search-R1's row schema.

Search-R1's guide tells users to write their own QA data as rows

    {"data_source", "prompt": [{"role": "user", "content"}], "ability",
     "reward_model": {"style": "rule", "ground_truth": <answers>}, "extra_info": {"split", "index"}}

with ``ground_truth`` either ``{"target": [answers]}`` (what its data scripts write) or the answer
itself (a string, or a list of strings). ``.parquet`` files are read with pyarrow; ``.jsonl`` (and
``.json`` holding one object per line) line by line. Both get the same checks, and every failure is
a ``ValueError`` naming the file, the row (parquet) or line (JSONL) and the field.

Rows of another form (FlashRAG's ``{"id", "question", "golden_answers"}``) are accepted through a
:class:`RowForm` that the caller passes: the environment owns how such a row becomes its own form
(``Environment.row_form``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

PARQUET_SUFFIXES = (".parquet",)
JSONL_SUFFIXES = (".jsonl", ".json")


@dataclass(frozen=True)
class RowForm:
    """Another row form the reader accepts: a row (JSONL) or file (parquet) that lacks a required
    field but holds all of ``fields`` becomes ``build(row, path, position, where)``, a row with the
    required fields. ``name`` says the form in error messages."""

    name: str
    fields: tuple[str, ...]
    build: Callable[[dict, Path, int, str], dict]

    def describe(self) -> str:
        return f"{self.name} rows {{{', '.join(map(repr, self.fields))}}}"


def read_rows(path: str | Path, required: Sequence[str],
              form: RowForm | None = None) -> Iterator[tuple[str, int, dict]]:
    """``(where, position, row)`` for each row of ``path``; ``where`` reads ``FILE row N`` (parquet,
    0-based) or ``FILE line N`` (JSONL, 1-based, as an editor shows it). Rows of ``form`` come out
    built into the required form.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: an unknown extension, unparsable JSON, a row that is not an object, a missing
            ``required`` field (naming file, row/line and field), or what ``form.build`` raises.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        yield from _parquet_rows(path, required, form)
    elif suffix in JSONL_SUFFIXES:
        yield from _jsonl_rows(path, required, form)
    else:
        raise ValueError(f"{path}: RL data must be parquet ({', '.join(PARQUET_SUFFIXES)}) or JSONL "
                         f"({', '.join(JSONL_SUFFIXES)}), got {path.suffix or 'no extension'!r}")


def _also(form: RowForm | None) -> str:
    return f"; {form.describe()} are read too" if form else ""


def _parquet_rows(path: Path, required: Sequence[str], form: RowForm | None) -> Iterator[tuple[str, int, dict]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = [key for key in required if key not in table.column_names]
    build = form is not None and missing and all(key in table.column_names for key in form.fields)
    if missing and not build:
        raise ValueError(f"{path}: no column {missing[0]!r} (columns: {table.column_names}){_also(form)}")
    for position, row in enumerate(table.to_pylist()):
        where = f"{path} row {position}"
        yield where, position, form.build(row, path, position, where) if build else row


def _jsonl_rows(path: Path, required: Sequence[str], form: RowForm | None) -> Iterator[tuple[str, int, dict]]:
    position = 0
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path} line {line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
            missing = [key for key in required if key not in row]
            if missing and form is not None and all(key in row for key in form.fields):
                row = form.build(row, path, position, where)
            elif missing:
                raise ValueError(f"{where}: no field {missing[0]!r} (fields: {sorted(row)}){_also(form)}")
            yield where, position, row
            position += 1


def check_reward_model(reward_model, where: str) -> dict:
    """``reward_model`` with ``ground_truth`` as ``{"target": [str, ...]}``.

    A bare answer (string or list of strings) becomes ``{"target": [...]}``, the form the data
    scripts write; the reward functions read both.

    Raises:
        ValueError: no ``reward_model`` mapping, no ``ground_truth``, or answers that are not
            strings (naming ``where`` and the field).
    """
    if not isinstance(reward_model, Mapping):
        raise ValueError(f"{where}: reward_model must be an object with 'ground_truth', got {reward_model!r:.120}")
    if "ground_truth" not in reward_model:
        raise ValueError(f"{where}: reward_model has no 'ground_truth' (fields: {sorted(reward_model)})")
    truth = reward_model["ground_truth"]
    field, wrapper = "reward_model.ground_truth", {}
    if isinstance(truth, Mapping):
        if "target" not in truth:
            raise ValueError(f"{where}: {field} is an object without 'target': {dict(truth)!r:.120}")
        wrapper, truth, field = dict(truth), truth["target"], field + ".target"
    answers = [truth] if isinstance(truth, str) else truth
    if not isinstance(answers, (list, tuple)) or not answers or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"{where}: {field} must be a string or a non-empty list of strings, got {truth!r:.120}")
    return {**reward_model, "ground_truth": {**wrapper, "target": list(answers)}}


def check_extra_info(extra_info, where: str) -> dict:
    """``extra_info`` as a dict (``{}`` when absent or null).

    Raises:
        ValueError: present but not an object.
    """
    if extra_info is None:
        return {}
    if not isinstance(extra_info, Mapping):
        raise ValueError(f"{where}: extra_info must be an object, got {extra_info!r:.120}")
    return dict(extra_info)
