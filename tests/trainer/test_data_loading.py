"""Data order is a function of (seed, epoch, position): resuming gives the same batches."""

import pytest

from verl.trainer.ppo.data_loading import ResumableBatchSampler


def _take(sampler, k):
    return [sampler.next_indices() for _ in range(k)]


@pytest.mark.parametrize("split", [1, 2, 3, 5])  # 3 batches per epoch: 3 is exactly the boundary
def test_resume_gives_same_order_across_epochs(split):
    straight = _take(ResumableBatchSampler(10, 3, shuffle=True, seed=7), 8)
    first = ResumableBatchSampler(10, 3, shuffle=True, seed=7)
    head = _take(first, split)
    resumed = ResumableBatchSampler(10, 3, shuffle=True, seed=7)
    resumed.load_state_dict(first.state_dict())
    assert head + _take(resumed, 8 - split) == straight


def test_epochs_are_permutations_and_differ():
    sampler = ResumableBatchSampler(9, 3, shuffle=True, seed=1)
    epoch0, epoch1 = sum(_take(sampler, 3), []), sum(_take(sampler, 3), [])
    assert sorted(epoch0) == sorted(epoch1) == list(range(9))
    assert epoch0 != epoch1


def test_no_shuffle_is_file_order_and_small_dataset_is_named():
    assert _take(ResumableBatchSampler(4, 2, shuffle=False), 2) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="train_batch_size=8 is larger than the dataset"):
        ResumableBatchSampler(5, 8)
