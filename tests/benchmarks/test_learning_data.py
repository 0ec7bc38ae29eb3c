"""The learning run's data (benchmarks/learning_data.py): validation never trained on, seeded, all seven sources."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("SEARCH_R1_SHARED_DATA", ROOT.parent / "shared" / "data"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import learning_data  # noqa: E402

from search_r1.envs.search_r1.prompts import question_of  # noqa: E402

pytestmark = pytest.mark.skipif(not (SHARED / "qa").is_dir(), reason=f"shared data not found at {SHARED}")


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def _questions(rows: list[dict]) -> list[str]:
    return [learning_data.question_key(question_of(r["prompt"][0]["content"])) for r in rows]


@pytest.fixture(scope="module")
def built(learning_data_seed_19) -> Path:
    return learning_data_seed_19  # the session's build with seed 19 (tests/benchmarks/conftest.py)


def test_validation_is_disjoint_from_training(built):
    train, test = _rows(built / "train.parquet"), _rows(built / "test.parquet")
    train_q, test_q = _questions(train), _questions(test)
    assert not set(train_q) & set(test_q)
    assert not set(test_q) & learning_data.warm_start_questions()  # nor seen by the SFT warm start
    assert len(set(train_q)) == len(train_q) and len(set(test_q)) == len(test_q)  # nothing twice


def test_validation_covers_the_seven_sources_with_a_thousand_questions(built):
    test = _rows(built / "test.parquet")
    counts = Counter(r["data_source"] for r in test)
    assert set(counts) == set(learning_data.SOURCES) and sum(counts.values()) >= 1000
    assert dict(counts) == learning_data.VAL_COUNTS
    summary = json.loads((built / "selection.json").read_text())
    assert {s: c["test"] for s, c in summary["counts"].items()} == dict(counts)
    assert summary["totals"]["train"] == len(_rows(built / "train.parquet"))


def test_training_questions_are_answered_by_the_corpus(built):
    answerable = set()
    for files, _, _ in learning_data.POOLS.values():
        for file in files:
            answerable |= {learning_data.question_key(r["question"]) for r in learning_data.read_jsonl(SHARED / "qa" / file)
                           if r.get("answer_in_linked_passages")}
    train_q = _questions(_rows(built / "train.parquet"))
    assert len(train_q) > 1500 and set(train_q) <= answerable
    corpus_ids = [json.loads(line)["id"] for line in open(built / "corpus.jsonl")]
    assert len(corpus_ids) == len(set(corpus_ids)) > 29_000


def test_seeded(built, tmp_path):
    learning_data.build(SHARED, tmp_path / "same", seed=19)
    learning_data.build(SHARED, tmp_path / "other", seed=20)
    assert _rows(tmp_path / "same" / "test.parquet") == _rows(built / "test.parquet")
    assert _rows(tmp_path / "same" / "train.parquet") == _rows(built / "train.parquet")
    assert _questions(_rows(tmp_path / "other" / "test.parquet")) != _questions(_rows(built / "test.parquet"))
