"""DataProto operations against hand-built expectations."""

import pickle

import numpy as np
import pytest
import torch

from verl.protocol import DataProto, DataProtoItem, pad_dataproto_to_divisor, unpad_dataproto


def make(n: int = 5) -> DataProto:
    return DataProto.from_dict(
        tensors={"input_ids": torch.arange(n * 3).view(n, 3), "score": torch.arange(n, dtype=torch.float32)},
        non_tensors={"uid": [f"u{i}" for i in range(n)], "raw_prompt_ids": [[i, i + 1] for i in range(n)]},
        meta_info={"temperature": 1.0},
    )


def rows(data: DataProto) -> list[int]:
    """Original row numbers, read back from ``score``."""
    return data.batch["score"].long().tolist()


def test_from_dict_keeps_lists_one_element_per_row():
    data = make()
    assert len(data) == 5
    assert data.non_tensor_batch["raw_prompt_ids"].shape == (5,)
    assert data.non_tensor_batch["raw_prompt_ids"][2] == [2, 3]


def test_from_single_dict_sorts_tensors_from_the_rest():
    data = DataProto.from_single_dict({"a": torch.zeros(2, 4), "b": ["x", "y"], "c": np.array([1, 2])}, meta_info={"k": 1})
    assert list(data.batch.keys()) == ["a"]
    assert sorted(data.non_tensor_batch) == ["b", "c"] and data.meta_info == {"k": 1}


def test_shape_mismatch_names_keys_and_shapes():
    with pytest.raises(ValueError, match=r"input_ids: \(3, 2\).*mask: \(4, 2\)"):
        DataProto.from_dict(tensors={"input_ids": torch.zeros(3, 2), "mask": torch.zeros(4, 2)})
    with pytest.raises(ValueError, match=r"uid: \(2,\)"):
        DataProto.from_dict(tensors={"input_ids": torch.zeros(3, 2)}, non_tensors={"uid": ["a", "b"]})
    with pytest.raises(ValueError, match="0-d"):
        DataProto.from_dict(tensors={"x": torch.tensor(1.0)})


def test_indexing_by_int_slice_and_index():
    data = make()
    item = data[-1]
    assert isinstance(item, DataProtoItem)
    assert item.batch["input_ids"].tolist() == [12, 13, 14] and item.non_tensor_batch["uid"] == "u4"
    assert rows(data[1:3]) == [1, 2]
    assert rows(data[torch.tensor([4, 0])]) == [4, 0]
    picked = data[np.array([True, False, True, False, False])]
    assert rows(picked) == [0, 2] and list(picked.non_tensor_batch["uid"]) == ["u0", "u2"]
    with pytest.raises(IndexError):
        data[5]


def test_chunk_is_balanced_and_always_gives_n_pieces():
    assert [len(c) for c in make(5).chunk(2)] == [3, 2]
    assert [len(c) for c in make(10).chunk(4)] == [3, 3, 2, 2]
    assert [len(c) for c in make(5).chunk(4)] == [2, 1, 1, 1]  # torch.chunk would give 3 pieces
    pieces = make(7).chunk(3)
    assert [rows(p) for p in pieces] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [list(p.non_tensor_batch["uid"]) for p in pieces][1] == ["u3", "u4"]
    with pytest.raises(ValueError, match="pad"):
        make(3).chunk(4)


def test_split_has_short_last_piece():
    assert [rows(p) for p in make(5).split(2)] == [[0, 1], [2, 3], [4]]


def test_repeat_interleave_and_tile():
    data = make(3)
    assert rows(data.repeat(2, interleave=True)) == [0, 0, 1, 1, 2, 2]
    assert list(data.repeat(2, interleave=True).non_tensor_batch["uid"]) == ["u0", "u0", "u1", "u1", "u2", "u2"]
    tiled = data.repeat(2, interleave=False)
    assert rows(tiled) == [0, 1, 2, 0, 1, 2] and list(tiled.non_tensor_batch["uid"]) == ["u0", "u1", "u2"] * 2


def test_reorder_moves_tensors_and_non_tensors_together():
    data = make(4)
    assert data.reorder(torch.tensor([3, 1, 0, 2])) is data
    assert rows(data) == [3, 1, 0, 2]
    assert list(data.non_tensor_batch["uid"]) == ["u3", "u1", "u0", "u2"]
    assert data.batch["input_ids"][0].tolist() == [9, 10, 11]
    with pytest.raises(ValueError, match="3 indices for 4 rows"):
        data.reorder([0, 1, 2])


def test_select_pop_rename():
    data = make()
    picked = data.select(batch_keys=["score"], non_tensor_batch_keys=["uid"], meta_info_keys=[])
    assert list(picked.batch.keys()) == ["score"] and list(picked.non_tensor_batch) == ["uid"] and picked.meta_info == {}
    deep = data.select(deepcopy=True)
    deep.batch["score"][0] = 100.0
    assert data.batch["score"][0] == 0.0
    popped = data.pop(batch_keys=["input_ids"], non_tensor_batch_keys=["raw_prompt_ids"])
    assert list(popped.batch.keys()) == ["input_ids"] and "input_ids" not in data.batch.keys()
    assert list(data.non_tensor_batch) == ["uid"] and len(data) == 5
    with pytest.raises(KeyError, match="missing_key"):
        data.select(batch_keys=["missing_key"])
    data.rename("score", "token_level_scores")
    assert list(data.batch.keys()) == ["token_level_scores"]


def test_union_merges_and_refuses_conflicts():
    data = make(3)
    other = DataProto.from_dict(tensors={"values": torch.ones(3, 2), "score": torch.arange(3, dtype=torch.float32)},
                                non_tensors={"uid": ["u0", "u1", "u2"]}, meta_info={"temperature": 1.0, "step": 4})
    merged = data.union(other)
    assert merged is data and sorted(data.batch.keys()) == ["input_ids", "score", "values"]
    assert data.meta_info == {"temperature": 1.0, "step": 4}
    with pytest.raises(ValueError, match="'score'"):
        make(3).union(DataProto.from_dict(tensors={"score": torch.zeros(3)}))
    with pytest.raises(ValueError, match="'uid'"):
        make(3).union(DataProto.from_dict(non_tensors={"uid": ["a", "b", "c"]}))
    with pytest.raises(ValueError, match="'temperature'"):
        make(3).union(DataProto.from_dict(non_tensors={"k": [1, 2, 3]}, meta_info={"temperature": 0.0}))
    with pytest.raises(ValueError, match="3 and 2 rows"):
        make(3).union(make(2))


def test_concat_round_trips_chunks_and_checks_keys():
    data = make(7)
    back = DataProto.concat(data.chunk(3))
    assert rows(back) == list(range(7)) and list(back.non_tensor_batch["uid"]) == [f"u{i}" for i in range(7)]
    assert back.meta_info == {"temperature": 1.0}
    with pytest.raises(ValueError, match="piece 1"):
        DataProto.concat([make(2), make(2).select(batch_keys=["score"])])


def test_pad_and_unpad():
    data = make(5)
    padded, pad_size = pad_dataproto_to_divisor(data, 4)
    assert pad_size == 3 and rows(padded) == [0, 1, 2, 3, 4, 0, 1, 2]
    assert rows(unpad_dataproto(padded, pad_size)) == [0, 1, 2, 3, 4]
    same, zero = pad_dataproto_to_divisor(data, 5)
    assert same is data and zero == 0
    tiny, pad = pad_dataproto_to_divisor(make(1), 3)  # padding longer than the data cycles
    assert pad == 2 and rows(tiny) == [0, 0, 0]


def test_non_tensor_only_dataproto():
    requests = DataProto.from_dict(non_tensors={"raw_prompt_ids": [[1], [2, 3], [4]]})
    assert requests.batch is None and len(requests) == 3
    halves = requests.chunk(2)
    assert [list(h.non_tensor_batch["raw_prompt_ids"]) for h in halves] == [[[1], [2, 3]], [[4]]]
    assert len(DataProto.concat(halves).repeat(2)) == 6


def test_pickle_round_trip():
    data = make()
    back = pickle.loads(pickle.dumps(data))
    assert torch.equal(back.batch["input_ids"], data.batch["input_ids"])
    assert list(back.non_tensor_batch["raw_prompt_ids"]) == list(data.non_tensor_batch["raw_prompt_ids"])
    assert back.meta_info == data.meta_info


def test_refused_union_leaves_self_untouched():
    data = make(3)
    other = DataProto.from_dict(tensors={"values": torch.ones(3)}, non_tensors={"uid": ["x", "y", "z"]})
    with pytest.raises(ValueError, match="'uid'"):
        data.union(other)
    assert "values" not in data.batch.keys() and list(data.non_tensor_batch["uid"]) == ["u0", "u1", "u2"]
