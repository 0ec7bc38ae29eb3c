"""The evaluation table: per-source EM with 95% bootstrap intervals, F1 and cover-EM beside it,
their averages, comparisons.

Input: the per-question records of validation (:mod:`verl.trainer.ppo.validation`). Output: a
JSON-able dict (``sources``, ``average``, ``pooled``, ``questions``) and its Markdown table.
Sources are listed in Search-R1 Table 2's order (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue,
Bamboogle), others after them by name. ``average`` is that table's "Avg.": the mean of the
per-source EMs, every source weighted equally; ``pooled`` is the plain mean over all questions.
F1 (SQuAD token F1), cover-EM (a gold answer contained in the normalised answer) and retrieved (a
gold answer occurs in a search's observation) are shown when the records carry them (``f1``,
``cover_em``, ``retrieved``: the QA rewards report them), averaged the same way; with ``retrieved``
comes ``em_when_retrieved``, the EM of the questions whose searches found a gold answer: what the
policy reads right when the retriever did its part (None for a source with no such question).
"""

from __future__ import annotations

import json
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np

from verl.trainer.evaluation import stats

SOURCE_ORDER = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
AVERAGE_DEFINITION = ("mean of the per-source EMs, each source weighted equally "
                      "(Search-R1 Table 2's Avg.); interval: bootstrap within each source")


def ordered_sources(names) -> list[str]:
    """Search-R1's order first, then the other names alphabetically."""
    names = set(names)
    return [s for s in SOURCE_ORDER if s in names] + sorted(names - set(SOURCE_ORDER))


def question_key(question: str) -> str:
    """Questions are the same when equal after lower-casing, whitespace collapsing and dropping a
    final ``?`` (the prompt template adds one)."""
    return " ".join(question.lower().split()).rstrip("?").strip()


def _seed(source: str, seed: int) -> int:
    # one stream per source: adding or dropping a source leaves the others' intervals unchanged
    return (seed + zlib.crc32(source.encode())) % (2**32)


# Answer matches shown beside EM when every record has them: record key -> column title.
SECONDARY = {"f1": "F1", "cover_em": "cover-EM", "retrieved": "retrieved", "em_when_retrieved": "EM when retrieved"}


def row_em(record: dict) -> float:
    """The record's exact match (its reward when the reward manager reported no EM)."""
    return float(record["em"] if "em" in record else record["score"])


def summarise(records: list[dict], format_reward: bool, num_resamples: int = stats.NUM_RESAMPLES,
              confidence: float = stats.CONFIDENCE, seed: int = 0) -> dict:
    """The evaluation table of per-question records.

    Args:
        records: dicts with ``data_source``, ``question``, ``em`` (or ``score``), ``score``,
            ``valid_search``, ``response_tokens``, ``answer``, and optionally ``f1``, ``cover_em``,
            ``retrieved``.
        format_reward: the format reward is on; the table then shows the mean reward (``score``).
    Returns:
        ``{"sources": {source: {count, em, em_ci, searches, response_tokens, answered[, score][, f1,
        cover_em, retrieved, em_when_retrieved]}}, "average": {em, em_ci, definition, num_sources[, f1,
        cover_em, retrieved, em_when_retrieved]}, "pooled": {count, em}, "questions": [[source,
        question key, em], ...], "format_reward", "confidence", "num_resamples"}`` (each of ``f1``,
        ``cover_em``, ``retrieved`` when every record has it; ``em_when_retrieved`` with ``retrieved``).
    Raises:
        ValueError: no records.
    """
    if not records:
        raise ValueError("no evaluated questions")
    by_source: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_source[str(record["data_source"])].append(record)
    secondary = [key for key in SECONDARY if all(key in r for r in records)]
    if "retrieved" in secondary:
        secondary.append("em_when_retrieved")
    sources = {name: _source_row(by_source[name], format_reward, num_resamples, confidence, _seed(name, seed),
                                 secondary)
               for name in ordered_sources(by_source)}
    groups = [[row_em(r) for r in by_source[name]] for name in sources]
    average = {"em": stats.average_of_means(groups),
               "em_ci": list(stats.average_interval(groups, num_resamples, confidence, seed)),
               "num_sources": len(groups), "definition": AVERAGE_DEFINITION}
    for key in secondary:
        values = [row[key] for row in sources.values() if row[key] is not None]
        average[key] = float(np.mean(values)) if values else None
    if format_reward:
        average["score"] = float(np.mean([row["score"] for row in sources.values()]))
    return {"sources": sources, "average": average,
            "pooled": {"count": len(records), "em": float(np.mean([row_em(r) for r in records]))},
            "questions": [[str(r["data_source"]), question_key(r["question"]), row_em(r)] for r in records],
            "format_reward": bool(format_reward), "confidence": confidence, "num_resamples": num_resamples}


def _source_row(rows: list[dict], format_reward: bool, num_resamples: int, confidence: float, seed: int,
                secondary: list[str] = ()) -> dict:
    ems = [row_em(r) for r in rows]
    row = {"count": len(rows), "em": float(np.mean(ems)),
           "em_ci": list(stats.mean_interval(ems, num_resamples, confidence, seed)),
           **{key: float(np.mean([float(r[key]) for r in rows])) for key in secondary if key != "em_when_retrieved"},
           "searches": float(np.mean([r.get("valid_search", 0) for r in rows])),
           "response_tokens": float(np.mean([r.get("response_tokens", 0) for r in rows])),
           "answered": float(np.mean([r.get("answer") is not None for r in rows]))}
    if "em_when_retrieved" in secondary:
        found = [row_em(r) for r in rows if r["retrieved"]]
        row["em_when_retrieved"] = float(np.mean(found)) if found else None
    if format_reward:
        row["score"] = float(np.mean([r["score"] for r in rows]))
    return row


def _number(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _interval(ci) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def to_markdown(report: dict) -> str:
    """The table of :func:`summarise` as Markdown (the average row last, with its definition)."""
    score = report["format_reward"]
    pct = f"{report['confidence']:.0%}"
    avg = report["average"]
    secondary = [key for key in SECONDARY if key in avg]
    head = ["source", "questions", "EM", f"EM {pct} CI"] + [SECONDARY[k] for k in secondary] + (
        ["score"] if score else []) + ["searches / question", "response tokens", "answered"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in report["sources"].items():
        cells = [name, str(row["count"]), f"{row['em']:.3f}", _interval(row["em_ci"])]
        cells += [_number(row[k]) for k in secondary]
        cells += [f"{row['score']:.3f}"] if score else []
        cells += [f"{row['searches']:.2f}", f"{row['response_tokens']:.1f}", f"{row['answered']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    cells = [f"**average** ({avg['num_sources']} sources)", str(report["pooled"]["count"]), f"**{avg['em']:.3f}**",
             _interval(avg["em_ci"])] + [_number(avg[k]) for k in secondary] + (
        [f"{avg['score']:.3f}"] if score else []) + ["", "", ""]
    lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"average = {avg['definition']}. Pooled over all {report['pooled']['count']} questions: "
                 f"EM {report['pooled']['em']:.3f}. Intervals: percentile bootstrap, "
                 f"{report['num_resamples']} resamples of the questions.")
    return "\n".join(lines)


def load_report(path: str | Path) -> dict:
    """An evaluation JSON written by ``evaluate.sh`` (its ``table`` part).

    Raises:
        ValueError: the file is missing, not JSON, or holds no evaluation table.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
    table = data.get("table", data) if isinstance(data, dict) else None
    if not isinstance(table, dict) or "sources" not in table or "questions" not in table:
        raise ValueError(f"{path}: no evaluation table (expected the JSON that evaluate.sh writes)")
    return table


def compare(a: dict, b: dict, num_resamples: int = stats.NUM_RESAMPLES, confidence: float = stats.CONFIDENCE,
            seed: int = 0) -> dict:
    """Per-source ``EM(b) - EM(a)`` with bootstrap intervals; paired where the questions match.

    A source is paired when both tables hold the same questions (by :func:`question_key`), and
    unpaired (independent resampling) otherwise. The average difference covers the sources in both.
    Returns ``{"sources": {source: {a, b, diff, diff_ci, paired, count_a, count_b}}, "average": {...},
    "only_in_a", "only_in_b", "confidence", "num_resamples"}``.
    """
    qa, qb = _questions_by_source(a), _questions_by_source(b)
    common = [s for s in ordered_sources(set(qa) | set(qb)) if s in qa and s in qb]
    rows, pairs = {}, []
    for name in common:
        left, right, paired = _align(qa[name], qb[name])
        diff_ci = stats.difference_interval(left, right, paired, num_resamples, confidence, _seed(name, seed))
        rows[name] = {"a": float(np.mean(left)), "b": float(np.mean(right)),
                      "diff": float(np.mean(right) - np.mean(left)), "diff_ci": list(diff_ci), "paired": paired,
                      "count_a": len(qa[name]), "count_b": len(qb[name])}
        pairs.append((left, right, paired))
    average = {}
    if pairs:
        mean_a = stats.average_of_means([p[0] for p in pairs])
        mean_b = stats.average_of_means([p[1] for p in pairs])
        average = {"a": mean_a, "b": mean_b, "diff": mean_b - mean_a, "num_sources": len(pairs),
                   "diff_ci": list(stats.average_difference_interval(pairs, num_resamples, confidence, seed))}
    return {"sources": rows, "average": average, "only_in_a": sorted(set(qa) - set(qb)),
            "only_in_b": sorted(set(qb) - set(qa)), "confidence": confidence, "num_resamples": num_resamples}


def _questions_by_source(table: dict) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for source, key, em in table["questions"]:
        out[source].append((key, float(em)))
    return out


def _align(left: list[tuple[str, float]], right: list[tuple[str, float]]):
    """EM arrays of both sides; sorted by question (paired) when both hold the same questions."""
    paired = sorted(k for k, _ in left) == sorted(k for k, _ in right)
    if paired:
        left, right = sorted(left), sorted(right)
    return np.array([v for _, v in left]), np.array([v for _, v in right]), paired


def compare_markdown(result: dict, name_a: str = "A", name_b: str = "B") -> str:
    """The comparison as Markdown: both EMs, the difference and its interval, per source."""
    pct = f"{result['confidence']:.0%}"
    lines = [f"| source | EM {name_a} | EM {name_b} | {name_b} - {name_a} | {pct} CI | bootstrap |", "|---|---|---|---|---|---|"]
    for name, row in result["sources"].items():
        kind = "paired" if row["paired"] else f"unpaired ({row['count_a']} vs {row['count_b']} questions)"
        lines.append(f"| {name} | {row['a']:.3f} | {row['b']:.3f} | {row['diff']:+.3f} | {_interval(row['diff_ci'])} | {kind} |")
    avg = result["average"]
    if avg:
        lines.append(f"| **average** ({avg['num_sources']} sources) | {avg['a']:.3f} | {avg['b']:.3f} | "
                     f"**{avg['diff']:+.3f}** | {_interval(avg['diff_ci'])} | per source as above |")
    for side, names in (("only in " + name_a, result["only_in_a"]), ("only in " + name_b, result["only_in_b"])):
        if names:
            lines.append(f"\n{side} (not compared): {', '.join(names)}")
    return "\n".join(lines)
