"""Deterministic, resumable batching of the RL dataset.

The order of batches is a pure function of ``(seed, epoch, position)``: epoch ``e`` shuffles with a
generator seeded ``seed + e``, and ``position`` counts batches already taken in that epoch. Saving
those two integers in a checkpoint and restoring them gives the same data order as a run that
never stopped, also when the stop falls on an epoch boundary. (A torch DataLoader's iterator state
is not checkpointable; this is.)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


class ResumableBatchSampler:
    """Yields lists of row indices, epoch after epoch, with a ``state_dict`` of (epoch, position).

    Args:
        num_rows: dataset size.
        batch_size: rows per batch; the last partial batch of an epoch is dropped.
        shuffle: permute rows each epoch (seeded), else file order.
        seed: base seed of the permutations.
    Raises:
        ValueError: the dataset is smaller than one batch.
    """

    def __init__(self, num_rows: int, batch_size: int, shuffle: bool = True, seed: int = 1):
        if batch_size <= 0 or num_rows < batch_size:
            raise ValueError(f"data.train_batch_size={batch_size} is larger than the dataset ({num_rows} rows)")
        self.num_rows, self.batch_size, self.shuffle, self.seed = num_rows, batch_size, shuffle, seed
        self.epoch = 0
        self.position = 0

    @property
    def batches_per_epoch(self) -> int:
        return self.num_rows // self.batch_size

    def _order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_rows)
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_rows, generator=generator)

    def next_indices(self) -> list[int]:
        """Indices of the next batch; advances (and wraps into the next epoch)."""
        if self.position >= self.batches_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.batch_size
        indices = self._order(self.epoch)[start:start + self.batch_size].tolist()
        self.position += 1
        return indices

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def collated_to_dataproto(batch: dict[str, Any]):
    """Split a collated dict into DataProto tensors (torch) and non-tensors (numpy object arrays)."""
    from verl.protocol import DataProto

    return DataProto.from_single_dict(batch)


class BatchLoader:
    """Batches of a map-style dataset in the sampler's order, as DataProto."""

    def __init__(self, dataset: Sequence, collate_fn: Callable, sampler: ResumableBatchSampler):
        self.dataset, self.collate_fn, self.sampler = dataset, collate_fn, sampler

    def next_batch(self):
        indices = self.sampler.next_indices()
        return collated_to_dataproto(self.collate_fn([self.dataset[i] for i in indices]))

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


class InOrderBatches:
    """All rows in file order in batches of ``batch_size`` (last one partial), for validation.

    Iterable (again and again); ``num_rows`` is the number of rows it yields (sizes progress bars).
    """

    def __init__(self, dataset: Sequence, collate_fn: Callable, batch_size: int):
        if batch_size <= 0:
            raise ValueError(f"data.val_batch_size must be positive, got {batch_size}")
        self.dataset, self.collate_fn, self.batch_size = dataset, collate_fn, int(batch_size)
        self.num_rows = len(dataset)

    def __iter__(self):
        for start in range(0, self.num_rows, self.batch_size):
            rows = [self.dataset[i] for i in range(start, min(start + self.batch_size, self.num_rows))]
            yield collated_to_dataproto(self.collate_fn(rows))


def iterate_in_order(dataset: Sequence, collate_fn: Callable, batch_size: int) -> InOrderBatches:
    """All rows in file order in batches of ``batch_size`` (last one partial), for validation."""
    return InOrderBatches(dataset, collate_fn, batch_size)
