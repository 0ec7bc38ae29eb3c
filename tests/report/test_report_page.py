"""The report page from handmade records: escaping, marks, the filters' counts, compare order, the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from search_r1.report import __main__ as cli
from search_r1.report import page

from .helpers import REPO, handmade, page_data, record, write_jsonl

EXPECTED_FLAGS = [[], ["wrong", "found_not_given"], ["wrong", "no_search"], ["no_search", "malformed"],
                  ["wrong", "found_not_given"]]


@pytest.fixture
def report(tmp_path):
    """The CLI's report of the handmade questions.jsonl: (html, path)."""
    path = write_jsonl(tmp_path / "run" / "questions.jsonl", handmade())
    assert cli.main([str(path.parent)]) == 0
    out = path.parent / "report.html"
    return out.read_text(encoding="utf-8"), out


def test_no_model_or_corpus_text_becomes_markup(report):
    html, _ = report
    # our own two script elements only: no text closed the data blob or opened another element
    assert html.count("<script") == 2 and html.count("</script>") == 2
    assert "<img" not in html and "<i>custom</i>" not in html and "<b>bold" not in html
    assert "&lt;i&gt;custom&lt;/i&gt;" in html  # the source name in the summary table, escaped by Jinja
    data = page_data(html)
    texts = json.dumps(data, ensure_ascii=False)
    assert "<script>window.pwned = 'passage'; alert(1)</script>" in texts  # the text itself is kept
    last = data["questions"][4]
    assert last["question"].startswith("</script><script>") and last["sides"][0]["answer"] == "<i>nothing</i>"


def test_gold_answers_are_marked_in_titles_and_passages(report):
    data = page_data(report[0])
    first = data["questions"][0]["sides"][0]["turns"][0]["documents"]
    assert first[0] == [1, ['"The Dukes of Hazzard (film)"'], ["", "Jessica Simpson", " played Daisy Duke."]]
    assert first[1][2] == ["Catherine Bach played Daisy in the series."]  # nothing marked
    france = data["questions"][1]["sides"][0]["turns"][0]["documents"][0]
    assert france[2] == ["Its capital, ", "Paris,", " is on the Seine."]


def test_filters_count_the_questions_they_select(report):
    html, _ = report
    data = page_data(html)
    assert [q["flags"] for q in data["questions"]] == EXPECTED_FLAGS
    counts = dict(re.findall(r'data-count="(\w+)">(\d+)<', html))
    assert counts == {"wrong": "3", "no_search": "2", "malformed": "1", "found_not_given": "2"}
    assert data["questions"][3]["sides"][0]["format"].startswith("unexpected text 'Spiders have eight legs'")


def test_summary_has_each_source_and_the_table_average(report):
    html, _ = report
    rows = re.findall(r"<tr>\s*<td>([^<]+)</td><td>(\d+)</td><td>([\d.]+)</td>", html)
    assert rows == [("nq", "4", "0.500"), ("&lt;i&gt;custom&lt;/i&gt;", "1", "0.000")]
    assert re.search(r'class="average">\s*<td>average \(2 sources\)</td><td>5</td><td>0.250</td>', html)


def test_compare_puts_flips_first_and_pairs_by_question(tmp_path):
    def run(name, ems, order):
        questions = [record(f"question {i}?", f"<think>t</think>\n<answer> {'a' if em else 'b'} </answer>",
                            ["a"], em, 0) for i, em in enumerate(ems)]
        return write_jsonl(tmp_path / name / "questions.jsonl", [questions[i] for i in order])

    a = run("a", [1, 1, 0, 0], [0, 1, 2, 3])            # q0 right->right, q1 right->wrong, q2 wrong->right,
    b = run("b", [1, 0, 1, 0, 1], [4, 3, 2, 1, 0])      # q3 wrong->wrong; q4 only in B; B in another order
    assert cli.main(["--compare", str(a), str(b)]) == 0
    html = (tmp_path / "b" / "compare.html").read_text()
    data = page_data(html)
    assert [(q["question"], q["group"]) for q in data["questions"]] == [
        ("question 1?", "worse"), ("question 2?", "better"), ("question 0?", "same"), ("question 3?", "same"),
        ("question 4?", "only_b")]
    assert [q["n"] for q in data["questions"]] == [1, 2, 3, 4, 5]
    assert data["questions"][4]["sides"][0] is None and data["runs"] == ["A: a", "B: b"]
    assert [[s["em"] for s in q["sides"]] for q in data["questions"][:4]] == [[1, 0], [0, 1], [1, 1], [0, 0]]
    counts = dict(re.findall(r'data-count="(\w+)">(\d+)<', html))
    assert (counts["flipped"], counts["worse"], counts["better"], counts["wrong"]) == ("2", "1", "1", "3")
    assert '<table class="summary" id="comparison">' in html and "unpaired (4 vs 5 questions)" in html


def test_a_long_run_holds_the_first_questions_of_each_source(tmp_path):
    records = [record(f"q{i}?", "<answer> x </answer>", ["x"], 1.0, 0, source="nq" if i < 8 else "popqa")
               for i in range(10)]
    assert page.select(records, 4) == [0, 1, 8, 9] and page.select(records, None) == list(range(10))
    path = write_jsonl(tmp_path / "many.jsonl", records)
    assert cli.main([str(path), "--max-questions", "3", "-o", str(tmp_path / "out.html")]) == 0
    html = (tmp_path / "out.html").read_text()
    assert [q["n"] for q in page_data(html)["questions"]] == [1, 2, 9]
    assert "Trajectories of 3 of the 10 questions" in html and "<td>nq</td><td>8</td>" in html


def _error(args) -> str:
    result = subprocess.run([sys.executable, "-m", "search_r1.report", *args], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_bad_inputs_are_one_line(tmp_path):
    assert "no such file or folder" in _error([str(tmp_path / "missing")])
    (tmp_path / "dumps").mkdir()
    write_jsonl(tmp_path / "dumps" / "10.jsonl", handmade()[:1])
    write_jsonl(tmp_path / "dumps" / "5.jsonl", handmade()[:1])
    assert _error([str(tmp_path / "dumps")]).endswith("no questions.jsonl; pass one of its validation dumps: 5.jsonl, 10.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(handmade()[0]) + "\n{not json\n")
    assert _error([str(bad)]) == f"error: {bad}:2: not JSON (Expecting property name enclosed in double quotes)"
    no_output = {k: v for k, v in handmade()[0].items() if k != "output"}
    write_jsonl(bad, [handmade()[0], no_output])
    assert _error([str(bad)]).startswith(f"error: {bad}:2: no 'output' key")
    write_jsonl(bad, [handmade()[0] | {"score": "high"}])
    assert _error([str(bad)]) == f"error: {bad}:1: 'score' is 'high', not int"
    run = write_jsonl(tmp_path / "run" / "questions.jsonl", handmade())
    (run.parent / "evaluation.json").write_text(json.dumps({"table": {"sources": {}, "questions": [["nq", "q", 1]]}}))
    assert "its table counts 1 questions" in _error([str(run.parent)])
