"""The shipped example data: size, counts, no train/test leakage, linked passages present."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "example"
sys.path.insert(0, str(REPO))

from verl.utils.reward_score.qa_em import normalize_answer  # noqa: E402

DATA_FILES = sorted((EXAMPLE / "qa").glob("*/*.jsonl")) + [EXAMPLE / "corpus.jsonl"]
TEST_SOURCES = {"nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"}


def read(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_size_under_5mb():
    assert sum(path.stat().st_size for path in EXAMPLE.rglob("*") if path.is_file()) < 5 * 2**20


def test_sets_and_counts():
    train = read(EXAMPLE / "qa/nq/train.jsonl") + read(EXAMPLE / "qa/hotpotqa/train.jsonl")
    assert 400 <= len(train) <= 800
    tests = {p.parent.name: read(p) for p in (EXAMPLE / "qa").glob("*/*.jsonl")
             if p.stem in ("test", "dev")}
    assert set(tests) == TEST_SOURCES
    assert all(len(rows) == 30 for rows in tests.values())
    for rows in tests.values():
        for row in rows:
            assert row["question"].strip() and row["golden_answers"]


def test_no_test_question_in_train():
    train = {normalize_answer(r["question"]) for p in (EXAMPLE / "qa").glob("*/train.jsonl")
             for r in read(p)}
    held_out = {normalize_answer(r["question"]) for p in (EXAMPLE / "qa").glob("*/*.jsonl")
                if p.stem != "train" for r in read(p)}
    assert not train & held_out


def test_linked_passages_are_in_corpus():
    corpus = read(EXAMPLE / "corpus.jsonl")
    ids = [row["id"] for row in corpus]
    assert len(ids) == len(set(ids)) and 1000 <= len(ids) <= 3000
    assert all(row["contents"].count("\n") >= 1 for row in corpus)
    linked = 0
    for path in (EXAMPLE / "qa").glob("*/*.jsonl"):
        for row in read(path):
            for key in ("sr1_retrieved_passage_ids", "context_passage_ids", "gold_passage_ids"):
                assert set(row.get(key, [])) <= set(ids), (path, row["id"], key)
            linked += bool(row.get("answer_in_linked_passages"))
    assert linked >= 300


def test_readme_counts_match_files():
    readme = (EXAMPLE / "README.md").read_text()
    for path in DATA_FILES:
        name = path.relative_to(EXAMPLE).as_posix()
        match = re.search(rf"\| `{re.escape(name)}` \| (\d+) \| (\d+) \|", readme)
        assert match, name
        assert int(match.group(1)) == len(read(path))
        assert int(match.group(2)) == path.stat().st_size


def test_builder_reproduces_example(tmp_path):
    shared = Path("/work/shared/data")
    if not shared.exists():
        pytest.skip("shared data folder not present")
    subprocess.run([sys.executable, str(REPO / "scripts/build_example.py"), "--out_dir", str(tmp_path)],
                   check=True, capture_output=True)
    for path in DATA_FILES + [EXAMPLE / "README.md"]:
        rel = path.relative_to(EXAMPLE)
        assert (tmp_path / rel).read_bytes() == path.read_bytes(), rel
