"""IVF / HNSW indexes built from a Flat file, recall@k against exact search, and serving them."""

import json

import faiss
import numpy as np
import pytest

from search_r1.search import index_builder
from search_r1.search.ann import (build_from_flat, default_train_size, exact_topk, ivf_nlist,
                                  measure_recall, recall_at_k, sample_rows)
from search_r1.search.corpus import write_corpus
from search_r1.search.flat_file import write_flat_file
from search_r1.search.index_meta import IndexMeta
from search_r1.search.loading import load_dense_index, resolve_gpu_search


def _clustered(num=6000, dim=32, clusters=60, seed=0):
    """Unit vectors around random centres (a crude stand-in for text embeddings)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = centres[rng.integers(0, clusters, num)] + 0.6 * rng.standard_normal((num, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    path = tmp_path_factory.mktemp("ann") / "v_Flat.index"
    vectors = _clustered()
    return write_flat_file(path, 32, len(vectors), [vectors[:2500], vectors[2500:]])


def test_recall_at_k_counts_overlap():
    truth = np.array([[1, 2, 3], [4, 5, 6]])
    assert recall_at_k(truth, truth, 3) == 1.0
    assert recall_at_k(np.array([[3, 9, 1], [-1, -1, 4]]), truth, 3) == pytest.approx(3 / 6)
    assert recall_at_k(np.array([[1, 2, 9], [4, 7, 8]]), truth, 2) == pytest.approx(3 / 4)
    with pytest.raises(ValueError, match="recall@3"):
        recall_at_k(truth[:, :2], truth, 3)


def test_exact_topk_equals_faiss_flat(flat):
    queries = sample_rows(flat, 20, seed=3) + 0.01
    scores, ids = exact_topk(flat, queries, 10)
    index = faiss.IndexFlatIP(32)
    index.add(flat.read_rows(0, flat.ntotal))
    ref_scores, ref_ids = index.search(queries.astype(np.float32), 10)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


def test_sample_rows_are_distinct_stored_rows(flat):
    sample = sample_rows(flat, 500, seed=0)
    every = flat.read_rows(0, flat.ntotal)
    assert len({row.tobytes() for row in sample}) == 500
    assert {row.tobytes() for row in sample} <= {row.tobytes() for row in every}


def test_train_size_defaults():
    assert ivf_nlist("IVF4096,PQ64") == 4096 and ivf_nlist("HNSW32") is None
    assert default_train_size("IVF4096,PQ64", 21_015_324) == 256 * 4096
    assert default_train_size("IVF65536,Flat", 21_015_324) == 2_000_000
    assert default_train_size("IVF64,Flat", 1000) == 1000


def test_ivf_recall_rises_with_nprobe_and_is_exact_when_all_lists_are_searched(flat):
    index, stats = build_from_flat(flat, "IVF64,Flat", train_size=3000, log=lambda m: None)
    assert index.ntotal == flat.ntotal and stats["train_size"] == 3000
    recalls = {}
    for nprobe in (1, 8, 64):
        index.nprobe = nprobe
        recalls[nprobe] = measure_recall(index, flat, 200, k=10)["recall_at_k"]
    assert recalls[1] < recalls[8] <= recalls[64] == 1.0


def test_pq_and_hnsw_recall(flat):
    pq, _ = build_from_flat(flat, "IVF16,PQ8", log=lambda m: None)
    pq.nprobe = 16
    pq_recall = measure_recall(pq, flat, 200)["recall_at_k"]
    hnsw, stats = build_from_flat(flat, "HNSW16", log=lambda m: None)
    assert stats["train_size"] == 0  # HNSW needs no training
    hnsw.hnsw.efSearch = 128
    hnsw_recall = measure_recall(hnsw, flat, 200)["recall_at_k"]
    # 8-byte codes of 32-d vectors lose detail; a graph with a wide search is near exact.
    assert 0.1 < pq_recall < 0.95 and hnsw_recall > 0.95


def test_builder_from_flat_writes_index_meta_and_recall(flat, tmp_path):
    corpus = tmp_path / "c.jsonl"
    write_corpus(({"id": f"p{i}", "contents": f"passage {i}"} for i in range(flat.ntotal)), corpus)
    index_builder.main(["--retrieval_method", "minilm", "--from_flat", flat.path, "--corpus_path", str(corpus),
                        "--save_dir", str(tmp_path), "--faiss_type", "IVF32,Flat", "--nprobe", "32",
                        "--recall_queries", "100", "--device", "cpu"])
    path = tmp_path / "minilm_IVF32_Flat.index"
    meta = IndexMeta.load(path)
    assert meta.faiss_type == "IVF32,Flat" and meta.search_params == {"nprobe": 32} and meta.dim == 32
    assert meta.corpus["num_rows"] == flat.ntotal and meta.encoder["name"] == "minilm"
    assert meta.extra["recall"]["recall_at_k"] == 1.0 and meta.extra["recall"]["num_queries"] == 100
    json.loads((tmp_path / "minilm_IVF32_Flat.index.meta.json").read_text())
    # The server's loader applies the recorded nprobe.
    dense = load_dense_index(str(path), str(corpus))
    assert dense.search_devices == ["faiss"] and faiss.extract_index_ivf(dense.index).nprobe == 32
    query = flat.read_rows(7, 8)
    assert dense.search_vectors(query, 3)[0][0]["document"]["id"] == "p7"


def test_builder_from_flat_without_meta_needs_a_corpus(flat, tmp_path):
    with pytest.raises(ValueError, match="has no meta JSON: pass --corpus_path"):
        index_builder.main(["--retrieval_method", "minilm", "--from_flat", flat.path,
                            "--save_dir", str(tmp_path), "--faiss_type", "HNSW8"])
    with pytest.raises(ValueError, match="FAISS cannot build it"):
        build_from_flat(flat, "NotAType99", log=lambda m: None)


def test_cpu_serving_of_a_flat_file_uses_torch_shards(flat, tmp_path):
    corpus = tmp_path / "c.jsonl"
    write_corpus(({"id": f"p{i}", "contents": f"passage {i}"} for i in range(flat.ntotal)), corpus)
    dense = load_dense_index(flat.path, str(corpus))
    assert dense.search_devices == ["cpu"] and dense.index is None and len(dense) == flat.ntotal
    assert set(dense.load_s) == {"corpus", "vectors"}
    scores, ids = dense.search_ids(flat.read_rows(11, 13), 5)
    assert ids[:, 0].tolist() == [11, 12] and scores[0, 0] == pytest.approx(1.0, abs=1e-5)


def test_gpu_search_choice_is_checked():
    with pytest.raises(ValueError, match="gpu_search must be one of"):
        resolve_gpu_search("cuda")
    if not hasattr(faiss, "StandardGpuResources"):
        assert resolve_gpu_search("auto") == "torch"
        with pytest.raises(ValueError, match="needs a GPU build of FAISS"):
            resolve_gpu_search("faiss")



def test_auto_gpu_search_keeps_flat_on_torch_and_gives_other_indexes_to_faiss_gpu(monkeypatch):
    """With a GPU build of FAISS installed, ``auto`` still serves a Flat inner-product index from
    torch's fp16 shards (faster through the server) and any other type with FAISS's GPU indexes."""
    from search_r1.search import loading

    monkeypatch.setattr(loading, "faiss_has_gpu", lambda: True)
    assert loading.resolve_gpu_search("auto", inner_product_flat=True) == "torch"
    assert loading.resolve_gpu_search("auto", inner_product_flat=False) == "faiss"
    assert loading.resolve_gpu_search("faiss", inner_product_flat=True) == "faiss"
