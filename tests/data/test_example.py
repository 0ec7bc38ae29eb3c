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

from search_r1.qa.answers import normalize_answer  # noqa: E402

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


def test_embedded_default_trains_on_questions_the_corpus_answers(tmp_path):
    """The embedded default's training rows (``scripts/quickstart.py``'s default sources) are
    questions that the bundled retriever can answer: BM25 over ``example/corpus.jsonl``, the
    question as the query, top 3 (the embedded run's topk), returns a passage holding a gold
    answer for most of them. The example's NQ-style train questions (AmbigQA train) have no
    passage in that corpus, so a mix with them fails this."""
    import pandas as pd

    sys.path.insert(0, str(REPO / "scripts"))
    import quickstart

    from search_r1.search.bm25 import BM25Retriever
    from search_r1.search.corpus import load_corpus

    quickstart.ensure_data(tmp_path, EXAMPLE / "qa")
    rows = pd.read_parquet(tmp_path / "train.parquet")
    questions = [r[0]["content"].split("Question: ", 1)[1].strip() for r in rows["prompt"]]
    answers = [list(r["ground_truth"]["target"]) for r in rows["reward_model"]]
    retriever = BM25Retriever.build(load_corpus(EXAMPLE / "corpus.jsonl"))
    hits = retriever.search(questions, topk=3)
    answered = [any(_answer_in(a, h["document"]["contents"]) for h in hit) for a, hit in zip(answers, hits)]
    assert len(rows) >= 100
    assert sum(answered) / len(rows) >= 0.5, f"{sum(answered)} of {len(rows)} training questions answerable"
    # a second call with the same sources keeps the files; other sources rebuild them
    stamp = (tmp_path / "sources.json").read_text()
    quickstart.ensure_data(tmp_path, EXAMPLE / "qa")
    assert (tmp_path / "sources.json").read_text() == stamp
    quickstart.ensure_data(tmp_path, EXAMPLE / "qa", train_sources="nq")
    assert set(pd.read_parquet(tmp_path / "train.parquet")["data_source"]) == {"nq"}


def _answer_in(golds: list[str], passage: str) -> bool:
    text = f" {normalize_answer(passage)} "
    return any(f" {normalize_answer(g)} " in text for g in golds if normalize_answer(g))
