"""Sharded exact search (the CPU path and the ``--faiss_gpu`` path without faiss-gpu) against FAISS."""

import faiss
import numpy as np
import pytest
import torch

from search_r1.search.corpus import load_corpus
from search_r1.search.dense import DenseIndex
from search_r1.search.flat_shards import FlatShards, flat_ip_vectors
from search_r1.search.loading import load_dense_index


def _flat_index(num: int = 1000, dim: int = 32, seed: int = 0):
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((num, dim)).astype(np.float32)
    index = faiss.IndexFlatIP(dim)
    index.add(vectors)
    queries = rng.standard_normal((17, dim)).astype(np.float32)
    return index, queries


@pytest.mark.parametrize("num_shards", [1, 3, 4])
def test_shards_match_faiss_exactly(num_shards):
    index, queries = _flat_index()
    shards = FlatShards(flat_ip_vectors(index), ["cpu"] * num_shards)
    scores, ids = shards.search(queries, 10)
    ref_scores, ref_ids = index.search(queries, 10)
    assert ids.shape == (17, 10) and ids.dtype == np.int64
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


def test_fp16_shards_keep_the_top_hit_and_scores_close():
    # fp16 is what GPU shards use; ties can reorder deep ranks, so compare the top hit and scores.
    index, queries = _flat_index()
    scores, ids = FlatShards(flat_ip_vectors(index), ["cpu", "cpu"], dtype=torch.float16).search(queries, 5)
    ref_scores, ref_ids = index.search(queries, 5)
    np.testing.assert_array_equal(ids[:, 0], ref_ids[:, 0])
    np.testing.assert_allclose(scores, ref_scores, rtol=2e-2, atol=2e-2)


def test_topk_larger_than_a_shard_merges_all_rows():
    index, queries = _flat_index(num=7)
    _, ids = FlatShards(flat_ip_vectors(index), ["cpu"] * 3).search(queries, 7)
    assert sorted(ids[0].tolist()) == list(range(7))


def test_cpu_shard_is_a_view_of_the_faiss_memory():
    index, _ = _flat_index()
    vectors = flat_ip_vectors(index)
    shards = FlatShards(vectors, ["cpu"])
    assert shards.shards[0].data_ptr() == vectors.data_ptr()


def test_gpu_search_without_faiss_gpu_refuses_non_flat_index(test_corpus):
    corpus = load_corpus(str(test_corpus))
    index = faiss.IndexHNSWFlat(8, 4)
    index.add(np.random.default_rng(0).standard_normal((len(corpus), 8)).astype(np.float32))
    with pytest.raises(ValueError, match="IndexHNSWFlat"):
        DenseIndex(index, corpus, torch_devices=["cuda:0"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_faiss_gpu_without_a_gpu_names_the_index(dense_index, test_corpus):
    with pytest.raises(RuntimeError, match="no GPU is visible.*minilm_Flat.index"):
        load_dense_index(str(dense_index), str(test_corpus), use_gpu=True)
