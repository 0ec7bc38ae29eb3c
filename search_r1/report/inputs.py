"""What the report reads: an ``evaluate.sh`` output folder, a ``questions.jsonl``, or a validation dump.

``evaluate.sh`` writes ``questions.jsonl`` beside ``evaluation.json`` (whose table the report then
shows as is); the trainer writes ``<trainer.validation_data_dir>/<step>.jsonl`` with the same
records (``verl.trainer.ppo.validation.batch_records``).
"""

from __future__ import annotations

import json
from pathlib import Path

from search_r1.report.page import Run
from verl.trainer.evaluation import report as table_report

# The keys every record needs, and their types; the others (gold, em, answer, valid_search, token
# counts, input) are shown when present.
REQUIRED = {"data_source": (str,), "question": (str,), "output": (str,), "score": (int, float)}


def read_questions(path: Path) -> list[dict]:
    """The records of a ``questions.jsonl`` / validation dump.

    Raises:
        ValueError: the file is not readable, a line is not a JSON object, a record lacks a
            required key or has one of the wrong type (naming the file, line and key), or it holds
            no record.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read ({error})") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: not a JSON object")
        for key, types in REQUIRED.items():
            if key not in record:
                raise ValueError(f"{path}:{number}: no {key!r} key (expected the records that evaluate.sh "
                                 "writes to questions.jsonl, or a trainer.validation_data_dir dump)")
            if not isinstance(record[key], types) or isinstance(record[key], bool):
                raise ValueError(f"{path}:{number}: {key!r} is {record[key]!r}, not {types[0].__name__}")
        records.append(record)
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def questions_file(path: Path) -> Path:
    """The records file that ``path`` names (itself, or a folder's ``questions.jsonl``).

    Raises:
        ValueError: no such file, or a folder without ``questions.jsonl`` (naming the validation
            dumps it holds, if any).
    """
    if path.is_file():
        return path
    if not path.is_dir():
        raise ValueError(f"{path}: no such file or folder")
    if (path / "questions.jsonl").is_file():
        return path / "questions.jsonl"
    dumps = sorted(path.glob("*.jsonl"), key=lambda p: (len(p.stem), p.stem))
    hint = f"; pass one of its validation dumps: {', '.join(p.name for p in dumps)}" if dumps else ""
    raise ValueError(f"{path}: no questions.jsonl{hint}")


def load_run(path: str | Path, label: str | None = None) -> Run:
    """The run at ``path``, labelled ``label`` (default: the folder's or file's name).

    With an ``evaluation.json`` beside ``questions.jsonl`` its table is the run's, and its model,
    step, date and commit are shown.

    Raises:
        ValueError: as :func:`questions_file`, :func:`read_questions`, ``report.load_report``, or
            an ``evaluation.json`` that counts other questions than ``questions.jsonl`` holds.
    """
    path = Path(path)
    questions = questions_file(path)
    records = read_questions(questions)
    name = questions.parent.name if questions.name == "questions.jsonl" else questions.name
    run = Run(label=label or name, records=records, details=[str(questions)])
    evaluation = questions.parent / "evaluation.json"
    if questions.name == "questions.jsonl" and evaluation.is_file():
        run.table = table_report.load_report(evaluation)
        if len(run.table["questions"]) != len(records):
            raise ValueError(f"{evaluation}: its table counts {len(run.table['questions'])} questions, "
                             f"{questions} holds {len(records)}")
        meta = json.loads(evaluation.read_text())
        run.details = [f"model {meta.get('model')} (step {meta.get('step')})",
                       f"{meta.get('date')}, commit {str(meta.get('commit'))[:10]}", str(questions)]
    return run


def default_output(path: str | Path) -> Path:
    """Where the report of ``path`` goes: ``<folder>/report.html``, or ``<file>.html`` beside a file."""
    path = Path(path)
    return path / "report.html" if path.is_dir() else path.with_suffix(".html")
