"""The trajectory report: one static HTML file to read what a model did, question by question.

    python -m search_r1.report PATH [-o OUT.html] [--max-questions N]
    python -m search_r1.report --compare A B [-o OUT.html]

PATH is an ``evaluate.sh`` output folder (``questions.jsonl`` + ``evaluation.json``), a
``questions.jsonl``, or a trainer validation dump (``<trainer.validation_data_dir>/<step>.jsonl``).
``bash evaluate.sh --html`` writes ``report.html`` beside ``evaluation.md``; the trainer writes
``<step>.html`` beside each validation dump. docs/evaluation.md ("The trajectory report") shows it.

Modules: ``trajectory`` (a record's turns, with the environment's parsing; gold-answer spans),
``page`` (the page's data and its Jinja2 rendering), ``inputs`` (reading runs), ``__main__`` (CLI).
"""

from __future__ import annotations

from pathlib import Path

from search_r1.report import page
from search_r1.report.page import Run
from verl.trainer.evaluation import report as table_report
from verl.trainer.evaluation import stats


def report_html(run: Run, title: str, max_questions: int | None = None,
                num_resamples: int = stats.NUM_RESAMPLES) -> str:
    """The report of one run: the summary over every question, the trajectories of all of them
    or of ``max_questions`` (taken source by source, :func:`page.select`)."""
    table = page.run_table(run, num_resamples)
    indices = page.select(run.records, max_questions)
    notes = [] if len(indices) == len(run.records) else [
        f"Trajectories of {len(indices)} of the {len(run.records)} questions (the first of each source); "
        "the summary counts them all."]
    return page.render(title, [run], page.single_questions(run, indices), [page.summary_rows(run, table)],
                       notes=notes)


def compare_html(a: Run, b: Run, title: str, num_resamples: int = stats.NUM_RESAMPLES) -> str:
    """Two runs side by side: both summaries, ``EM(B) - EM(A)`` per source with its interval
    (paired where both hold the same questions), and every question, the flipped ones first."""
    tables = [page.run_table(run, num_resamples) for run in (a, b)]
    comparison = table_report.compare(tables[0], tables[1], num_resamples)
    return page.render(title, [a, b], page.compare_questions(a, b),
                       [page.summary_rows(run, table) for run, table in zip((a, b), tables)], comparison)


def write_report(records: list[dict], path: Path, title: str, label: str, table: dict | None = None,
                 max_questions: int | None = None, details: tuple[str, ...] = ()) -> Path:
    """Write the report of validation records to ``path`` (the trainer's dumps, ``evaluate.sh --html``).

    Args:
        records: ``verl.trainer.ppo.validation`` records.
        label: the run's name on the page (the output folder, the step).
        table: the evaluation table of these records, when one was computed (``evaluate.sh``).
        max_questions: trajectories the page holds at most (None: all).
        details: lines under the run's name (model, files).
    Returns:
        ``path``.
    """
    run = Run(label=label, records=records, table=table, details=list(details))
    path.write_text(report_html(run, title, max_questions), encoding="utf-8")
    return path
