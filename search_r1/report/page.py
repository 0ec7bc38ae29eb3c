"""The report page: per-source summary, filters and every question's trajectory, as one HTML file.

The page is rendered by Jinja2 with autoescaping; the trajectories travel inside it as one JSON
blob (``tojson``: ``<``, ``>``, ``&`` and ``'`` written as ``\\uXXXX``, so no model or corpus text can
close the script element) that the page's own script renders a page of questions at a time with
``textContent`` (text is never parsed as HTML). No server, no network: CSS and JS are inline.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from typing import Sequence

import jinja2
import numpy as np
from markupsafe import Markup

from search_r1.report.trajectory import Turn, action_prefix, parse_turns, segments
from verl.trainer.evaluation import report as table_report
from search_r1.envs.search_r1.parsing import extract_solution
from search_r1.envs.search_r1.reward_format import check_format

# (key, label, what it selects); the counts on the page are the questions each one selects.
FILTERS = (
    ("wrong", "wrong answer", "exact match 0: no answer, or one that matches no gold answer"),
    ("no_search", "no search", "no valid <search> call"),
    ("malformed", "malformed tags", "the format reward's tag check fails (qa_em_format.check_format); "
                                    "the card names the first offending tag or text"),
    ("found_not_given", "in passages, not given",
     "a retrieved passage holds a gold answer (marked), and the answer is wrong"),
)
COMPARE_FILTERS = (
    ("flipped", "flipped", "right in one run, wrong in the other"),
    ("worse", "right → wrong", "right in A, wrong in B"),
    ("better", "wrong → right", "wrong in A, right in B"),
)
# compare mode: flips first, then the unchanged questions, then those only one run holds
COMPARE_ORDER = ("worse", "better", "same", "only_a", "only_b")


@dataclass
class Run:
    """One evaluated run: its records (file order), the evaluation table when the run came with
    one (``evaluation.json``), and what to call it on the page."""

    label: str
    records: list[dict]
    table: dict | None = None
    details: list[str] = field(default_factory=list)


def format_check(record: dict) -> tuple[bool, str]:
    """The format reward's tag check of a record's response, from the tag its prompt opened (if any)."""
    prefix = action_prefix(str(record.get("input", "")))
    return check_format(prefix + record["output"], prefix)


def question_side(record: dict) -> dict:
    """What the page shows of one record: answer, scores, counts, flags and the parsed turns."""
    golds = [str(g) for g in record.get("gold") or []]
    turns = parse_turns(record["output"], golds, action_prefix(str(record.get("input", ""))))
    valid, reason = format_check(record)
    em = table_report.row_em(record)
    searches = int(record.get("valid_search", sum(turn.action == "search" for turn in turns)))
    found = any(document.has_gold for turn in turns for document in turn.documents)
    flags = [key for key, on in (("wrong", em < 1), ("no_search", searches == 0), ("malformed", not valid),
                                 ("found_not_given", found and em < 1)) if on]
    answer = record["answer"] if "answer" in record else extract_solution(record["output"])
    return {"answer": answer, "em": em,
            "score": float(record["score"]), "searches": searches, "turns": [_turn(t) for t in turns],
            "generated_tokens": record.get("response_tokens"), "response_tokens": record.get("response_length"),
            "finished": record.get("finished"), "truncated": record.get("truncated"),
            "format": None if valid else reason, "prompt": str(record.get("input", "")), "flags": flags}


def _turn(turn: Turn) -> dict:
    out = {"reasoning": turn.reasoning, "outside": turn.outside, "action": turn.action, "content": turn.content,
           "observation": turn.observation,
           "documents": [[d.rank, segments(d.title, d.title_gold), segments(d.text, d.text_gold)]
                         for d in turn.documents]}
    if turn.action is None:  # an invalid or unfinished turn is shown as written
        out["text"] = turn.text
    return out


def run_table(run: Run, num_resamples: int) -> dict:
    """The run's evaluation table: its own (``evaluation.json``), else computed from the records.

    Without a table the score column is shown when some record's reward differs from its EM
    (a format reward was on).
    """
    if run.table is not None:
        return run.table
    format_reward = any(float(r["score"]) != table_report.row_em(r) for r in run.records)
    return table_report.summarise(run.records, format_reward, num_resamples)


def summary_rows(run: Run, table: dict) -> list[dict]:
    """One row per source (the table's order) and the average: the table's figures plus format
    errors and response length (observations included) from the records. The average row holds
    the table's average EM and the totals (as evaluation.md, no per-question means)."""
    well_formed = [format_check(record)[0] for record in run.records]
    by_source: dict[str, list[int]] = {}
    for index, record in enumerate(run.records):
        by_source.setdefault(str(record["data_source"]), []).append(index)
    rows = []
    for name, row in table["sources"].items():
        indices = by_source.get(name, [])
        lengths = [run.records[i]["response_length"] for i in indices if "response_length" in run.records[i]]
        rows.append({"source": name, **row, "score": row.get("score"), "average": False,
                     "format_errors": sum(not well_formed[i] for i in indices),
                     "response_length": float(np.mean(lengths)) if lengths else None})
    average = table["average"]
    rows.append({"source": f"average ({average['num_sources']} sources)", "count": table["pooled"]["count"],
                 "em": average["em"], "em_ci": average["em_ci"], "score": average.get("score"), "searches": None,
                 "response_tokens": None, "response_length": None, "answered": None,
                 "format_errors": sum(not ok for ok in well_formed), "average": True})
    return rows


def select(records: Sequence[dict], limit: int | None) -> list[int]:
    """Indices of the records whose trajectories the page holds: all, or ``limit`` of them taken
    source by source in turns (each source's first questions), kept in file order."""
    if limit is None or limit >= len(records):
        return list(range(len(records)))
    by_source: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        by_source.setdefault(str(record["data_source"]), []).append(index)
    chosen: list[int] = []
    depth = 0
    while len(chosen) < limit:
        chosen += [indices[depth] for indices in by_source.values() if depth < len(indices)][:limit - len(chosen)]
        depth += 1
    return sorted(chosen)


def single_questions(run: Run, indices: Sequence[int]) -> list[dict]:
    """The page's question list for one run."""
    questions = []
    for index in indices:
        record = run.records[index]
        side = question_side(record)
        questions.append({"n": index + 1, "source": str(record["data_source"]), "uid": str(record.get("uid", "")),
                          "question": str(record["question"]), "gold": [str(g) for g in record.get("gold") or []],
                          "flags": side["flags"], "sides": [side]})
    return questions


def compare_questions(a: Run, b: Run) -> list[dict]:
    """Both runs' questions paired by source and question text (``report.question_key``; repeats
    paired in order), ordered as :data:`COMPARE_ORDER`, file order (A's) within each group."""
    def keyed(run: Run) -> dict[tuple, dict]:
        seen: Counter = Counter()
        out = {}
        for record in run.records:
            key = (str(record["data_source"]), table_report.question_key(str(record["question"])))
            out[key + (seen[key],)] = record
            seen[key] += 1
        return out

    left, right = keyed(a), keyed(b)
    groups: dict[str, list[dict]] = {name: [] for name in COMPARE_ORDER}
    for key in list(left) + [k for k in right if k not in left]:
        ra, rb = left.get(key), right.get(key)
        sides = [question_side(ra) if ra else None, question_side(rb) if rb else None]
        record = ra or rb
        flags = sorted({flag for side in sides if side for flag in side["flags"]}, key=_flag_order)
        if ra and rb:
            right_a, right_b = sides[0]["em"] >= 1, sides[1]["em"] >= 1
            group = "same" if right_a == right_b else ("worse" if right_a else "better")
            flags += ["flipped", group] if group != "same" else []
        else:
            group = "only_a" if ra else "only_b"
        groups[group].append({"source": key[0], "uid": str(record.get("uid", "")),
                              "question": str(record["question"]), "gold": [str(g) for g in record.get("gold") or []],
                              "flags": flags, "group": group, "sides": sides})
    questions = [q for name in COMPARE_ORDER for q in groups[name]]
    return [{"n": number, **question} for number, question in enumerate(questions, start=1)]


def _flag_order(flag: str) -> int:
    return [key for key, _, _ in FILTERS].index(flag)


def filter_counts(questions: Sequence[dict], filters) -> list[dict]:
    """Each filter with the number of questions it selects."""
    counts = Counter(flag for question in questions for flag in question["flags"])
    return [{"key": key, "label": label, "help": help_text, "count": counts[key]} for key, label, help_text in filters]


_TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("search_r1.report", "templates"),
                                autoescape=True, undefined=jinja2.StrictUndefined,
                                trim_blocks=True, lstrip_blocks=True)
_TEMPLATES.policies["json.dumps_kwargs"] = {"ensure_ascii": False, "separators": (",", ":")}


def _asset(name: str) -> Markup:
    """The page's own CSS/JS, inlined as is (ours, not data: no escaping)."""
    return Markup(resources.files("search_r1.report").joinpath("templates", name).read_text(encoding="utf-8"))


def render(title: str, runs: Sequence[Run], questions: list[dict], summaries: list[list[dict]],
           comparison: dict | None = None, notes: Sequence[str] = ()) -> str:
    """The HTML page.

    Args:
        title: the page's heading.
        runs: one run, or two (``A``, ``B``) for a comparison.
        questions: :func:`single_questions` or :func:`compare_questions`.
        summaries: :func:`summary_rows` per run.
        comparison: ``report.compare`` of the two tables (compare mode).
        notes: lines shown under the heading (e.g. how many trajectories the page holds).
    """
    filters = filter_counts(questions, (COMPARE_FILTERS if comparison is not None else ()) + FILTERS)
    sources = list(dict.fromkeys(q["source"] for q in questions))
    tables = [{"rows": rows, "score": any(row["score"] is not None for row in rows)} for rows in summaries]
    data = {"mode": "compare" if comparison is not None else "single", "runs": [run.label for run in runs],
            "labels": {f["key"]: f["label"] for f in filters}, "questions": questions}
    return _TEMPLATES.get_template("report.html.j2").render(
        title=title, runs=[{"label": run.label, "details": run.details} for run in runs], tables=tables,
        comparison=comparison, filters=filters, sources=sources, notes=list(notes), total=len(questions),
        data=data, css=_asset("report.css"), script=_asset("report.js"))
