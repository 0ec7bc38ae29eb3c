"""Corpus loading, index meta, mismatch refusal, BM25 reload and FlashRAG index compatibility."""

import sys

import faiss
import numpy as np
import pytest

from search_r1.search.bm25 import BM25Retriever
from search_r1.search.corpus import CorpusFormatError, load_corpus
from search_r1.search.index_meta import IndexMeta, IndexMismatchError
from search_r1.search.loading import load_bm25_retriever, load_dense_index, load_dense_retriever



@pytest.mark.parametrize("lines,message", [
    (['{"id": "a", "contents": "x"}', '{"id": "b"}'], ":2: missing field 'contents'"),
    (['{"id": "a", "contents": "x"}', "", '{"id": "c", "contents": '], ":3: invalid JSON"),
    (['{"id": "a", "contents": 5}'], ":1: 'contents' must be a string"),
    (['["a", "x"]'], ":1: expected a JSON object"),
])
def test_malformed_corpus_names_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusFormatError, match=f"bad.jsonl{message}"):
        load_corpus(path)


def test_corpus_int_ids_and_take_order(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": 1, "contents": "\\"A\\"\\nx", "title": "A"}\n{"id": 2, "contents": "\\"B\\"\\ny"}\n')
    corpus = load_corpus(path)
    assert corpus.take([1, 0]) == [{"id": "2", "contents": '"B"\ny'}, {"id": "1", "contents": '"A"\nx'}]


def test_meta_records_how_the_index_was_built(dense_index, test_corpus):
    meta = IndexMeta.load(dense_index)
    assert meta.retrieval_method == "minilm" and meta.faiss_type == "Flat" and meta.dim == 384
    assert meta.encoder["pooling"] == "mean" and meta.encoder["normalize"] is True
    assert meta.corpus["num_rows"] == 406 and meta.corpus["first_id"] == load_corpus(test_corpus)[0]["id"]


def test_mismatched_corpus_is_refused(dense_index, bm25_index, test_corpus, tmp_path):
    rows = test_corpus.read_text().splitlines()
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("\n".join(rows[::-1]) + "\n")  # same size, other order
    with pytest.raises(IndexMismatchError, match="first_id"):
        load_dense_index(str(dense_index), str(shuffled))
    shorter = tmp_path / "short.jsonl"
    shorter.write_text("\n".join(rows[:-1]) + "\n")
    with pytest.raises(IndexMismatchError, match="405 rows"):
        load_bm25_retriever(str(bm25_index), str(shorter))


def test_mismatched_encoder_is_refused(dense_index, test_corpus):
    with pytest.raises(IndexMismatchError, match="built with encoder"):
        load_dense_retriever(str(dense_index), str(test_corpus), "minilm", retriever_model="intfloat/e5-base-v2")
    with pytest.raises(IndexMismatchError, match="retrieval_method 'minilm'"):
        load_dense_retriever(str(dense_index), str(test_corpus), "e5")


def test_bm25_reloads_with_same_results(bm25_index, test_corpus):
    corpus = load_corpus(test_corpus)
    built = BM25Retriever.build(corpus)
    loaded = load_bm25_retriever(str(bm25_index), str(test_corpus))
    queries = ["who was the president of the united states", "moon landing apollo"]
    a, b = built.search(queries, 5), loaded.search(queries, 5)
    assert [[h["document"]["id"] for h in q] for q in a] == [[h["document"]["id"] for h in q] for q in b]
    assert np.allclose([h["score"] for h in a[0]], [h["score"] for h in b[0]], atol=1e-5)


def test_bm25_returns_only_passages_that_match(example_bm25):
    """A query matching one passage gets that one, not two score-0 fillers; a query matching none
    gets an empty list, which renders as the empty search the trainer counts."""
    from search_r1.envs.search_r1.prompts import format_observation
    from search_r1.search.passages import format_passages

    index, corpus = example_bm25
    retriever = load_bm25_retriever(str(index), str(corpus))
    cziffra, berkshire, nothing, empty = retriever.search(["Cziffra", "flag of Berkshire", "zzqxv", ""], topk=3)
    assert len(cziffra) == 1 and "Cziffra" in cziffra[0]["document"]["contents"] and cziffra[0]["score"] > 0
    assert len(berkshire) == 3 and all(hit["score"] > 0 for hit in berkshire)
    assert nothing == [] and empty == []
    assert format_observation(format_passages(nothing)) == "\n\n<information></information>\n\n"


def test_flashrag_e5_index_loads_unchanged(shared_corpus_dir):
    """FlashRAG's e5 Flat index + its corpus, no meta: searched with its own stored vectors."""
    index_path = shared_corpus_dir / "wiki18_flashrag_sample.e5_flat.index"
    corpus_path = shared_corpus_dir / "wiki18_flashrag_sample.jsonl"
    assert IndexMeta.load(index_path) is None
    dense = load_dense_index(str(index_path), str(corpus_path))
    assert len(dense) == 1000 and dense.dim == 768
    rows = [0, 17, 999]
    flat = faiss.read_index(str(index_path))
    vectors = np.stack([flat.reconstruct(i) for i in rows])
    results = dense.search_vectors(vectors, topk=3)
    for row, hits in zip(rows, results):
        assert hits[0]["document"]["id"] == f"flashrag-sample-{row}"
        assert hits[0]["score"] == pytest.approx(1.0, abs=1e-3) and hits[1]["score"] < hits[0]["score"]
    with pytest.raises(IndexMismatchError, match="1000 entries"):
        load_dense_index(str(index_path), str(shared_corpus_dir / "musique_paragraphs.jsonl"))


def test_bm25_stemmed_index_refuses_to_load_without_pystemmer(bm25_index, test_corpus, monkeypatch):
    """Unstemmed queries against stemmed passages would quietly ruin retrieval: refuse instead."""
    monkeypatch.setitem(sys.modules, "Stemmer", None)
    with pytest.raises(ImportError, match="'english' needs PyStemmer"):
        load_bm25_retriever(str(bm25_index), str(test_corpus))
