"""The chunked FAISS Flat reader/writer and the chunked loader into shards, against FAISS itself."""

import faiss
import numpy as np
import pytest
import torch

from search_r1.search import flat_shards
from search_r1.search.flat_file import FlatFileError, open_flat_file, write_flat_file
from search_r1.search.flat_shards import load_flat_shards


def _write_faiss(path, index, vectors):
    index.add(vectors)
    faiss.write_index(index, str(path))
    return path


def _vectors(num=1000, dim=24, seed=0):
    return np.random.default_rng(seed).standard_normal((num, dim)).astype(np.float32)


@pytest.mark.parametrize("make", [lambda d: faiss.IndexFlatIP(d), lambda d: faiss.IndexFlatL2(d),
                                  lambda d: faiss.IndexFlat(d, faiss.METRIC_L1)])
def test_reader_matches_faiss_read_index(tmp_path, make):
    vectors = _vectors()
    path = _write_faiss(tmp_path / "x.index", make(24), vectors)
    flat = open_flat_file(path)
    loaded = faiss.read_index(str(path))
    assert (flat.dim, flat.ntotal, flat.metric_type) == (loaded.d, loaded.ntotal, loaded.metric_type)
    stored = faiss.rev_swig_ptr(loaded.get_xb(), loaded.ntotal * loaded.d).reshape(loaded.ntotal, loaded.d)
    np.testing.assert_array_equal(flat.read_rows(0, flat.ntotal, threads=3), stored)
    np.testing.assert_array_equal(np.asarray(flat.memmap()), stored)
    chunks = list(flat.iter_chunks(300, start=100, stop=1000))
    assert [lo for lo, _ in chunks] == [100, 400, 700]
    np.testing.assert_array_equal(np.concatenate([c for _, c in chunks]), stored[100:])


def test_reader_on_the_flashrag_e5_index(shared_corpus_dir):
    path = shared_corpus_dir / "wiki18_flashrag_sample.e5_flat.index"
    flat = open_flat_file(path)
    loaded = faiss.read_index(str(path))
    assert (flat.dim, flat.ntotal) == (768, 1000)
    rows = flat.read_rows(990, 1000)
    np.testing.assert_array_equal(rows, np.stack([loaded.reconstruct(i) for i in range(990, 1000)]))


def test_writer_is_byte_identical_to_faiss(tmp_path):
    vectors = _vectors(500, 16)
    reference = _write_faiss(tmp_path / "faiss.index", faiss.IndexFlatIP(16), vectors)
    ours = tmp_path / "ours.index"
    write_flat_file(ours, 16, 500, (vectors[i:i + 128] for i in range(0, 500, 128)))
    assert ours.read_bytes() == reference.read_bytes()
    l2 = write_flat_file(tmp_path / "l2.index", 16, 500, [vectors], metric_type=1)
    assert faiss.read_index(l2.path).metric_type == faiss.METRIC_L2


def test_writer_refuses_wrong_row_counts_and_leaves_nothing(tmp_path):
    vectors = _vectors(10, 8)
    with pytest.raises(ValueError, match="hold 10 rows, the header declares 11"):
        write_flat_file(tmp_path / "a.index", 8, 11, [vectors])
    with pytest.raises(ValueError, match=r"shape \(10, 8\), expected \(rows, 4\)"):
        write_flat_file(tmp_path / "b.index", 4, 10, [vectors])
    assert list(tmp_path.iterdir()) == []


def test_truncated_or_padded_file_is_named(tmp_path):
    path = _write_faiss(tmp_path / "x.index", faiss.IndexFlatIP(24), _vectors())
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(FlatFileError, match=r"x.index: .* bytes but a 1000 x 24 Flat index .*truncated"):
        open_flat_file(path)
    path.write_bytes(data + b"junk")
    with pytest.raises(FlatFileError, match="trailing data"):
        open_flat_file(path)
    path.write_bytes(data[:20])
    with pytest.raises(FlatFileError, match="truncated FAISS Flat header"):
        open_flat_file(path)


def test_other_index_types_are_not_flat(tmp_path):
    path = _write_faiss(tmp_path / "h.index", faiss.IndexHNSWFlat(24, 8), _vectors(200))
    assert open_flat_file(path) is None


@pytest.mark.parametrize("devices,dtype", [(["cpu"], None), (["cpu"] * 3, None),
                                           (["cpu", "cpu"], torch.float16)])
def test_load_flat_shards_matches_faiss_search(tmp_path, devices, dtype, monkeypatch):
    vectors = _vectors(5000, 32)
    path = _write_faiss(tmp_path / "x.index", faiss.IndexFlatIP(32), vectors)
    reference = faiss.read_index(str(path))
    # Tiny staging chunks: the fp16 case goes through many ring-buffer rounds and shard boundaries.
    shards = load_flat_shards(open_flat_file(path), devices, dtype=dtype, threads=3, staging_bytes=32 * 4 * 333)
    assert shards.ntotal == 5000 and shards.offsets == flat_shards.shard_bounds(5000, len(devices))[:-1]
    np.testing.assert_array_equal(torch.cat([s.float() for s in shards.shards]).numpy(),
                                  vectors.astype(np.float16 if dtype else np.float32).astype(np.float32))
    queries = _vectors(9, 32, seed=1)
    ref_scores, ref_ids = reference.search(queries, 10)
    scores, ids = shards.search(queries, 10)
    if dtype is None:
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
    else:  # fp16 scores reorder near-ties
        from search_r1.search.ann import recall_at_k

        assert recall_at_k(ids, ref_ids, 10) >= 0.9
        np.testing.assert_allclose(scores, ref_scores, rtol=2e-2, atol=5e-2)


def test_blockwise_search_equals_one_matmul(tmp_path, monkeypatch):
    vectors = _vectors(20000, 16)
    index = faiss.IndexFlatIP(16)
    index.add(vectors)
    queries = _vectors(5, 16, seed=2)
    # A 4096-row block per matmul (the minimum): five blocks per shard, merged.
    monkeypatch.setitem(flat_shards.SCORE_BUDGET_BYTES, "cpu", 1)
    scores, ids = flat_shards.FlatShards(torch.from_numpy(vectors), ["cpu"]).search(queries, 7)
    ref_scores, ref_ids = index.search(queries, 7)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
