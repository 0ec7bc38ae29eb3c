"""The evaluation table and the comparison of two tables, from per-question records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from verl.trainer.evaluation import report


def _records(source: str, ems: list[float], prefix: str = "q", searches: int = 1) -> list[dict]:
    return [{"data_source": source, "question": f"{prefix} {i} of {source}?", "em": em, "score": 0.2 + 0.8 * em,
             "valid_search": searches, "response_tokens": 100 + i, "answer": "x" if i % 2 else None}
            for i, em in enumerate(ems)]


def test_table_rows_in_paper_order_and_the_average_is_the_mean_of_source_ems():
    records = _records("bamboogle", [1, 0, 0, 0]) + _records("nq", [1.0] * 6 + [0.0] * 4) + _records("custom", [0, 1])
    table = report.summarise(records, format_reward=True, num_resamples=500)
    assert list(table["sources"]) == ["nq", "bamboogle", "custom"]
    nq = table["sources"]["nq"]
    assert nq["count"] == 10 and nq["em"] == pytest.approx(0.6) and nq["em_ci"][0] <= 0.6 <= nq["em_ci"][1]
    assert nq["score"] == pytest.approx(0.2 + 0.8 * 0.6) and nq["searches"] == 1.0
    assert nq["response_tokens"] == pytest.approx(104.5) and nq["answered"] == 0.5
    assert table["average"]["em"] == pytest.approx((0.6 + 0.25 + 0.5) / 3)  # not the pooled 8/16
    assert table["pooled"] == {"count": 16, "em": pytest.approx(8 / 16)}
    assert table["average"]["em_ci"][0] <= table["average"]["em"] <= table["average"]["em_ci"][1]
    assert len(table["questions"]) == 16 and table["questions"][0] == ["bamboogle", "q 0 of bamboogle", 1.0]
    text = report.to_markdown(table)
    assert "| nq | 10 | 0.600 |" in text and "**average** (3 sources)" in text and "Table 2" in text
    assert "| score |" in text
    assert "score" not in report.to_markdown(report.summarise(records, format_reward=False, num_resamples=50))


def test_table_shows_f1_and_cover_em_beside_em_when_records_carry_them():
    records = _records("nq", [1, 0, 0, 0]) + _records("popqa", [1, 1])
    for record, (f1, cover) in zip(records, [(1.0, 1), (0.5, 1), (0.0, 0), (0.25, 0), (1.0, 1), (0.8, 1)]):
        record.update(f1=f1, cover_em=cover)
    table = report.summarise(records, format_reward=False, num_resamples=100)
    assert table["sources"]["nq"]["f1"] == pytest.approx(1.75 / 4) and table["sources"]["nq"]["cover_em"] == 0.5
    assert table["average"]["f1"] == pytest.approx((1.75 / 4 + 0.9) / 2)
    assert table["average"]["cover_em"] == pytest.approx((0.5 + 1.0) / 2)
    text = report.to_markdown(table)
    assert "| source | questions | EM | EM 95% CI | F1 | cover-EM |" in text
    assert "| nq | 4 | 0.250 | " in text and " | 0.438 | 0.500 | " in text
    without = report.summarise(_records("nq", [1, 0]), format_reward=False, num_resamples=50)
    assert "f1" not in without["average"] and "F1" not in report.to_markdown(without)


def test_retrieved_and_em_when_retrieved_separate_search_misses_from_reading_misses():
    records = _records("nq", [1, 0, 0, 1]) + _records("musique", [0, 1])
    for record, retrieved in zip(records, [1, 1, 0, 0, 0, 0]):
        record["retrieved"] = retrieved
    table = report.summarise(records, format_reward=False, num_resamples=50)
    nq, musique = table["sources"]["nq"], table["sources"]["musique"]
    assert nq["retrieved"] == 0.5 and nq["em_when_retrieved"] == 0.5  # one right of the two found
    assert musique["retrieved"] == 0.0 and musique["em_when_retrieved"] is None  # nothing found to read
    assert table["average"]["retrieved"] == 0.25 and table["average"]["em_when_retrieved"] == 0.5
    text = report.to_markdown(table)
    assert "| retrieved | EM when retrieved |" in text and "| musique | 2 | 0.500 | " in text and " | 0.000 | - |" in text


def test_intervals_do_not_depend_on_the_other_sources():
    nq = _records("nq", [1, 0, 1, 1, 0, 0, 1])
    alone = report.summarise(nq, False, num_resamples=300)["sources"]["nq"]["em_ci"]
    mixed = report.summarise(nq + _records("popqa", [0, 1]), False, num_resamples=300)["sources"]["nq"]["em_ci"]
    assert alone == mixed


def test_compare_pairs_matching_questions_and_not_others():
    base = _records("nq", [0.0] * 30) + _records("popqa", [0.0] * 20) + _records("musique", [1.0])
    better = _records("nq", [1.0] * 10 + [0.0] * 20) + _records("popqa", [1.0] * 5 + [0.0] * 20, prefix="other")
    result = report.compare(report.summarise(base, False, 200), report.summarise(better, False, 200))
    nq, popqa = result["sources"]["nq"], result["sources"]["popqa"]
    assert nq["paired"] and nq["diff"] == pytest.approx(1 / 3) and nq["diff_ci"][0] > 0
    assert not popqa["paired"] and (popqa["count_a"], popqa["count_b"]) == (20, 25)
    assert popqa["diff"] == pytest.approx(0.2)
    assert result["only_in_a"] == ["musique"] and result["only_in_b"] == []
    assert result["average"]["diff"] == pytest.approx((1 / 3 + 0.2) / 2) and result["average"]["num_sources"] == 2
    text = report.compare_markdown(result)
    assert "| nq | 0.000 | 0.333 | +0.333 |" in text and "unpaired (20 vs 25 questions)" in text
    assert "only in A (not compared): musique" in text


def test_paired_by_question_text_whatever_the_order():
    a = _records("nq", [1, 0, 1, 0])
    b = list(reversed(_records("nq", [1, 0, 1, 0])))  # the same per-question EMs, in another order
    result = report.compare(report.summarise(a, False, 100), report.summarise(b, False, 100))
    assert result["sources"]["nq"]["paired"] and result["sources"]["nq"]["diff_ci"] == [0.0, 0.0]


def test_load_report_rejects_other_files(tmp_path):
    good = tmp_path / "eval.json"
    good.write_text(json.dumps({"model": "m", "table": report.summarise(_records("nq", [1, 0]), False, 10)}))
    assert report.load_report(good)["sources"]["nq"]["count"] == 2
    (tmp_path / "other.json").write_text(json.dumps({"step": 1}))
    (tmp_path / "broken.json").write_text("{")
    for name, message in (("missing.json", "no such file"), ("other.json", "no evaluation table"),
                          ("broken.json", "not JSON")):
        with pytest.raises(ValueError, match=message):
            report.load_report(tmp_path / name)


def test_question_key_ignores_case_space_and_the_final_question_mark():
    assert report.question_key("Who  wrote Hamlet?") == report.question_key("who wrote hamlet") == "who wrote hamlet"
    assert np.isclose(report.row_em({"score": 0.3}), 0.3)
