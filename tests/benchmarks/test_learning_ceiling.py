"""The retrieval-ceiling measure (benchmarks/learning_ceiling.py) on a small real BM25 index."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import learning_ceiling  # noqa: E402


def test_answers_count_as_whole_normalised_tokens():
    assert learning_ceiling.answer_in_passages(["1889"], ['"Eiffel Tower"\nIt was completed in 1889.'])
    assert learning_ceiling.answer_in_passages(["The Beatles"], ["songs by beatles, mostly"])  # article, case, comma
    assert not learning_ceiling.answer_in_passages(["Paris"], ["a Parisian cafe"])
    assert not learning_ceiling.answer_in_passages(["", "the"], ["the the the"])  # empty after normalisation


def test_hits_and_table_over_a_real_bm25_index():
    from search_r1.search.bm25 import BM25Retriever
    from search_r1.search.corpus import Corpus

    corpus = Corpus.from_rows([
        {"id": "0", "contents": '"Eiffel Tower"\nThe Eiffel Tower in Paris was completed in 1889.'},
        {"id": "1", "contents": '"Canberra"\nCanberra is the capital city of Australia.'},
        {"id": "2", "contents": '"Jupiter"\nJupiter is the largest planet in the Solar System.'},
        {"id": "3", "contents": '"Mona Lisa"\nA portrait painted by Leonardo da Vinci.'},
    ])
    retriever = BM25Retriever.build(corpus)
    rows = {"nq": [{"question": "when was the eiffel tower completed", "golden_answers": ["1889"]},
                   {"question": "who painted the mona lisa", "golden_answers": ["Leonardo da Vinci"]}],
            "popqa": [{"question": "what is the capital of france", "golden_answers": ["Lyon"]}]}
    found = {"bm25": {s: learning_ceiling.hits(retriever, r, batch_size=1) for s, r in rows.items()}}
    assert found["bm25"] == {"nq": [True, True], "popqa": [False]}
    found["dense"] = {"nq": [True, False], "popqa": [True]}
    table = learning_ceiling.ceiling(rows, found)
    assert table["nq"] == {"count": 2, "bm25": 1.0, "dense": 0.5, "either": 1.0, "dense_over_bm25": 0.5}
    assert table["popqa"]["either"] == 1.0 and table["popqa"]["dense_over_bm25"] is None
    assert table["average"] == {"bm25": 0.5, "dense": 0.75, "either": 1.0}
    assert table["pooled"] == {"bm25": pytest.approx(2 / 3), "dense": pytest.approx(2 / 3), "either": 1.0, "count": 3}
