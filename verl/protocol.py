"""DataProto: the batch that travels between the controller and the workers.

A ``DataProto`` holds three things for B rows:

* ``batch``: a ``tensordict.TensorDict`` with ``batch_size == [B]`` whose tensors all start with the
  row dimension, e.g. ``input_ids`` of shape ``(B, T)``. It may be ``None`` for a batch that carries
  only non-tensor data (rollout requests of raw prompt ids, for instance).
* ``non_tensor_batch``: ``dict[str, np.ndarray]``, each array of length B (``dtype=object`` for
  Python values such as lists of token ids, dicts or strings).
* ``meta_info``: a plain ``dict`` for batch-level values (temperature, metrics, ...). It is not
  sliced; every piece of a split batch shares a shallow copy of it.

The API follows veRL's ``verl.protocol`` so code written for veRL reads the same here. Where veRL
mutates in place (``union``, ``reorder``, ``rename``, ``to``), so does this class, and those
methods also return ``self`` so they can be chained. Everything pickles (TensorDict + numpy), which
is what Ray needs to move a batch between processes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["DataProto", "DataProtoItem", "pad_dataproto_to_divisor", "unpad_dataproto"]


def to_object_array(values: Sequence[Any]) -> np.ndarray:
    """Turns a sequence into a 1-D ``dtype=object`` array of length ``len(values)``.

    ``np.array(list_of_equal_length_lists, dtype=object)`` would build a 2-D array; per-row lists
    (token ids, passages) must stay one element per row, so the array is filled element by element.
    """
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array


def _as_numpy_array(key: str, values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, torch.Tensor):
        raise ValueError(f"non-tensor key {key!r} holds a torch.Tensor; put it in `tensors` instead")
    if isinstance(values, (list, tuple)):
        return to_object_array(values)
    raise ValueError(f"non-tensor key {key!r} must be a list, tuple or np.ndarray, got {type(values).__name__}")


def _check_row_counts(shapes: dict[str, tuple], kind: str) -> int | None:
    """Returns the common leading dimension of ``shapes`` or raises naming every key and shape."""
    lengths = {shape[0] if len(shape) else None for shape in shapes.values()}
    if None in lengths:
        scalars = [k for k, s in shapes.items() if len(s) == 0]
        raise ValueError(f"{kind} keys {scalars} are 0-d; every value needs a leading row dimension")
    if len(lengths) > 1:
        listing = ", ".join(f"{k}: {tuple(s)}" for k, s in shapes.items())
        raise ValueError(f"{kind} values disagree on the number of rows: {listing}")
    return lengths.pop() if lengths else None


def _index_to_numpy(index: Any) -> Any:
    if isinstance(index, torch.Tensor):
        return index.detach().cpu().numpy()
    return index


def _index_to_torch(index: Any) -> Any:
    if isinstance(index, np.ndarray):
        return torch.from_numpy(index)
    if isinstance(index, (list, tuple)):
        return torch.as_tensor(index)
    return index


def _values_equal(a: Any, b: Any) -> bool:
    """Equality that tolerates numpy/torch values (whose ``==`` is elementwise)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_arr, b_arr = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
        if a_arr.shape != b_arr.shape:
            return False
        return all(_values_equal(x, y) for x, y in zip(a_arr.ravel(), b_arr.ravel()))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_values_equal(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # values whose == is ambiguous are treated as different
        return False


@dataclass
class DataProtoItem:
    """One row of a :class:`DataProto` (``data[i]``).

    ``batch`` is a TensorDict with ``batch_size == []`` (each tensor loses its row dimension, e.g.
    ``input_ids`` becomes ``(T,)``); ``non_tensor_batch`` maps keys to the row's values;
    ``meta_info`` is the parent's dict (shared, not copied).
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto:
    """A batch of B rows: tensors ``(B, ...)``, per-row numpy arrays ``(B,)`` and ``meta_info``.

    Construct it with :meth:`from_dict` or :meth:`from_single_dict`. The constructor checks
    consistency and raises ``ValueError`` naming the keys and shapes that disagree.
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_consistency()

    # ----------------------------------------------------------------------------------------
    # construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict | None = None,
    ) -> "DataProto":
        """Builds a DataProto from tensors ``(B, ...)`` and per-row values (lists or arrays of B).

        Lists and tuples in ``non_tensors`` become 1-D ``dtype=object`` arrays (one element per row,
        even when the elements are equal-length lists). With no tensors, ``batch`` is ``None``.

        Raises:
            ValueError: a tensor is 0-d, or the keys disagree on B (the message lists every key
                with its shape).
        """
        tensors = dict(tensors or {})
        non_tensor_batch = {k: _as_numpy_array(k, v) for k, v in (non_tensors or {}).items()}
        for key, value in tensors.items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"tensor key {key!r} holds {type(value).__name__}, not a torch.Tensor")
        shapes = {k: tuple(v.shape) for k, v in tensors.items()}
        shapes.update({k: tuple(v.shape) for k, v in non_tensor_batch.items()})
        num_rows = _check_row_counts(shapes, "DataProto.from_dict")
        batch = TensorDict(tensors, batch_size=[num_rows]) if tensors else None
        return cls(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict | None = None) -> "DataProto":
        """Like :meth:`from_dict`, sorting one mixed dict: ``torch.Tensor`` values go to ``batch``,
        everything else (lists, numpy arrays) to ``non_tensor_batch``."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)

    def check_consistency(self) -> None:
        """Checks that ``batch`` is 1-D batched and every non-tensor array has the same B rows.

        Raises:
            ValueError: naming the keys and shapes that disagree.
        """
        if self.batch is not None:
            if not isinstance(self.batch, TensorDict):
                raise ValueError(f"DataProto.batch must be a TensorDict or None, got {type(self.batch).__name__}")
            if self.batch.batch_dims != 1:
                raise ValueError(f"DataProto.batch must have one batch dimension, got batch_size {list(self.batch.batch_size)}")
        if not isinstance(self.meta_info, dict):
            raise ValueError(f"DataProto.meta_info must be a dict, got {type(self.meta_info).__name__}")
        shapes = {}
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise ValueError(f"non_tensor_batch[{key!r}] must be an np.ndarray, got {type(value).__name__}")
            shapes[key] = value.shape
        if self.batch is not None:
            shapes = {"<batch>": tuple(self.batch.batch_size), **shapes}
        _check_row_counts(shapes, "DataProto")

    # ----------------------------------------------------------------------------------------
    # size and indexing
    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0

    def __getitem__(self, index: Any) -> "DataProto | DataProtoItem":
        """``data[i]`` -> :class:`DataProtoItem` (one row); a slice, a list, or an integer/bool
        index tensor or array -> a new DataProto with those rows (a slice gives views)."""
        if isinstance(index, (int, np.integer)):
            n = len(self)
            if not -n <= index < n:
                raise IndexError(f"row {index} out of range for a DataProto of {n} rows")
            batch = self.batch[int(index)] if self.batch is not None else None
            non_tensor = {k: v[index] for k, v in self.non_tensor_batch.items()}
            return DataProtoItem(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)
        if isinstance(index, (torch.Tensor, np.ndarray)) and index.ndim != 1:
            raise IndexError(f"DataProto index must be 1-D, got shape {tuple(index.shape)}")
        batch = self.batch[_index_to_torch(index)] if self.batch is not None else None
        np_index = _index_to_numpy(index)
        non_tensor = {k: v[np_index] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> "DataProto":
        """Rows ``start:end:step`` (views of the tensors)."""
        return self[slice(start, end, step)]

    # ----------------------------------------------------------------------------------------
    # key selection
    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> "DataProto":
        """A DataProto with only the named keys; ``None`` keeps every key of that kind.

        Raises:
            KeyError: a named key is missing (the message names it).
        """
        batch = self.batch
        if batch_keys is not None:
            batch_keys = list(batch_keys)
            self._require_keys(batch_keys, [])
            batch = self.batch.select(*batch_keys) if batch_keys else None
        non_tensor = self._pick(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch")
        meta = self._pick(self.meta_info, meta_info_keys, "meta_info")
        if batch is None and batch_keys is not None and not non_tensor and len(self):
            # keep the row count visible even when no tensor survives: an empty TensorDict of B rows
            batch = TensorDict({}, batch_size=[len(self)])
        result = DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
        return copy.deepcopy(result) if deepcopy else result

    def pop(
        self,
        batch_keys: Iterable[str] = (),
        non_tensor_batch_keys: Iterable[str] = (),
        meta_info_keys: Iterable[str] = (),
    ) -> "DataProto":
        """Removes the named keys from ``self`` and returns them as a new DataProto.

        Raises:
            KeyError: a named key is missing (nothing is removed then).
        """
        batch_keys, non_tensor_batch_keys, meta_info_keys = list(batch_keys), list(non_tensor_batch_keys), list(meta_info_keys)
        self._require_keys(batch_keys, non_tensor_batch_keys)
        self._pick(self.meta_info, meta_info_keys, "meta_info")  # validates meta keys
        popped = self.select(batch_keys, non_tensor_batch_keys, meta_info_keys)
        if batch_keys:
            self.batch = self.batch.exclude(*batch_keys)
        for key in non_tensor_batch_keys:
            del self.non_tensor_batch[key]
        for key in meta_info_keys:
            del self.meta_info[key]
        return popped

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> "DataProto":
        """Renames batch (tensor) keys in place; returns ``self``.

        Raises:
            ValueError: the two lists differ in length. KeyError: an old key is missing.
        """
        old_keys = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new_keys = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old_keys) != len(new_keys):
            raise ValueError(f"rename got {len(old_keys)} old keys {old_keys} but {len(new_keys)} new keys {new_keys}")
        self._require_keys(old_keys, [])
        for old, new in zip(old_keys, new_keys):
            self.batch.rename_key_(old, new)
        return self

    def _require_keys(self, batch_keys: Sequence[str], non_tensor_keys: Sequence[str]) -> None:
        present = set(self.batch.keys()) if self.batch is not None else set()
        missing = [k for k in batch_keys if k not in present]
        if missing:
            raise KeyError(f"batch keys {missing} not in DataProto (has {sorted(present)})")
        missing = [k for k in non_tensor_keys if k not in self.non_tensor_batch]
        if missing:
            raise KeyError(f"non_tensor_batch keys {missing} not in DataProto (has {sorted(self.non_tensor_batch)})")

    @staticmethod
    def _pick(source: dict, keys: Iterable[str] | None, kind: str) -> dict:
        if keys is None:
            return dict(source)
        keys = list(keys)
        missing = [k for k in keys if k not in source]
        if missing:
            raise KeyError(f"{kind} keys {missing} not in DataProto (has {sorted(source)})")
        return {k: source[k] for k in keys}

    # ----------------------------------------------------------------------------------------
    # combining
    def union(self, other: "DataProto") -> "DataProto":
        """Adds ``other``'s keys to ``self`` in place and returns ``self``.

        A key present in both must hold equal values (tensors compared exactly).

        Raises:
            ValueError: the row counts differ, or a shared key holds different values (named).
        """
        if len(self) != len(other) and not (self._is_empty() or other._is_empty()):
            raise ValueError(f"cannot union DataProtos of {len(self)} and {len(other)} rows")
        # check every key before changing anything, so a refused union leaves self untouched
        self._check_union_conflicts(other)
        if self.batch is None:
            self.batch = other.batch
        elif other.batch is not None:
            for key in other.batch.keys():
                if key not in self.batch.keys():
                    self.batch[key] = other.batch[key]
        self.non_tensor_batch.update(other.non_tensor_batch)
        self.meta_info.update(other.meta_info)
        return self

    def _is_empty(self) -> bool:
        return self.batch is None and not self.non_tensor_batch

    def _check_union_conflicts(self, other: "DataProto") -> None:
        if self.batch is not None and other.batch is not None:
            for key in other.batch.keys():
                if key in self.batch.keys() and not _values_equal(self.batch[key], other.batch[key]):
                    raise ValueError(
                        f"union conflict on batch key {key!r}: shapes {tuple(self.batch[key].shape)} and "
                        f"{tuple(other.batch[key].shape)}, values differ"
                    )
        for key, value in other.non_tensor_batch.items():
            if key in self.non_tensor_batch and not _values_equal(self.non_tensor_batch[key], value):
                raise ValueError(f"union conflict on non_tensor_batch key {key!r}: the two DataProtos hold different values")
        for key, value in other.meta_info.items():
            if key in self.meta_info and not _values_equal(self.meta_info[key], value):
                raise ValueError(f"union conflict on meta_info key {key!r}: {self.meta_info[key]!r} != {value!r}")

    @staticmethod
    def concat(data: Sequence["DataProto"]) -> "DataProto":
        """Concatenates DataProtos along rows (in order). ``meta_info`` is the first one's.

        Raises:
            ValueError: the list is empty, or the pieces hold different keys (named).
        """
        data = list(data)
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto")
        first = data[0]
        for i, piece in enumerate(data[1:], start=1):
            first_keys = sorted(first.batch.keys()) if first.batch is not None else None
            piece_keys = sorted(piece.batch.keys()) if piece.batch is not None else None
            if first_keys != piece_keys or sorted(first.non_tensor_batch) != sorted(piece.non_tensor_batch):
                raise ValueError(
                    f"DataProto.concat: piece {i} has keys batch={piece_keys} non_tensor={sorted(piece.non_tensor_batch)}, "
                    f"piece 0 has batch={first_keys} non_tensor={sorted(first.non_tensor_batch)}"
                )
        batch = torch.cat([d.batch for d in data], dim=0) if first.batch is not None else None
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data], axis=0) for k in first.non_tensor_batch}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(first.meta_info))

    # ----------------------------------------------------------------------------------------
    # splitting and reordering
    def chunk(self, chunks: int) -> list["DataProto"]:
        """Splits into exactly ``chunks`` pieces of contiguous rows.

        Rule (``numpy.array_split``): with B rows, the first ``B % chunks`` pieces get
        ``B // chunks + 1`` rows and the rest ``B // chunks``; so 5 rows in 2 chunks give 3 + 2 and
        10 rows in 4 give 3 + 3 + 2 + 2. Unlike ``torch.chunk`` (which gives 5 rows in 4 chunks as
        2 + 2 + 1, only three pieces), the number of pieces is always ``chunks``.

        Raises:
            ValueError: ``chunks < 1`` or ``B < chunks`` (a piece would be empty; pad first with
                :func:`pad_dataproto_to_divisor`).
        """
        n = len(self)
        if chunks < 1:
            raise ValueError(f"chunk needs chunks >= 1, got {chunks}")
        if n < chunks:
            raise ValueError(f"cannot chunk {n} rows into {chunks} non-empty pieces; pad with pad_dataproto_to_divisor first")
        base, extra = divmod(n, chunks)
        sizes = [base + 1 if i < extra else base for i in range(chunks)]
        return self._split_by_sizes(sizes)

    def split(self, split_size: int) -> list["DataProto"]:
        """Splits into pieces of ``split_size`` rows; the last piece holds the remainder (like
        ``torch.split``): 10 rows with size 4 give 4 + 4 + 2.

        Raises:
            ValueError: ``split_size < 1``.
        """
        if split_size < 1:
            raise ValueError(f"split needs split_size >= 1, got {split_size}")
        n = len(self)
        sizes = [min(split_size, n - start) for start in range(0, n, split_size)]
        return self._split_by_sizes(sizes)

    def _split_by_sizes(self, sizes: Sequence[int]) -> list["DataProto"]:
        pieces, start = [], 0
        for size in sizes:
            pieces.append(self[start : start + size])
            start += size
        return pieces

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> "DataProto":
        """Repeats every row ``repeat_times`` times (a new DataProto of ``B * repeat_times`` rows).

        ``interleave=True`` keeps copies of a row adjacent (``[a, a, b, b]``, what GRPO groups
        need); ``interleave=False`` tiles the whole batch (``[a, b, a, b]``).

        Raises:
            ValueError: ``repeat_times < 1``.
        """
        if repeat_times < 1:
            raise ValueError(f"repeat needs repeat_times >= 1, got {repeat_times}")
        rows = np.arange(len(self))
        index = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return self[index]

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> "DataProto":
        """Permutes the rows in place (row ``i`` becomes old row ``indices[i]``); returns ``self``.

        Raises:
            ValueError: ``indices`` has a length other than B.
        """
        if len(indices) != len(self):
            raise ValueError(f"reorder got {len(indices)} indices for {len(self)} rows")
        reordered = self[_index_to_numpy(indices) if not isinstance(indices, np.ndarray) else indices]
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
        return self

    def to(self, device: str | torch.device) -> "DataProto":
        """Moves the tensors to ``device`` in place; returns ``self``."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def __repr__(self) -> str:
        tensors = {k: tuple(v.shape) for k, v in self.batch.items()} if self.batch is not None else {}
        return (
            f"DataProto(rows={len(self)}, batch={tensors}, non_tensor_batch={sorted(self.non_tensor_batch)}, "
            f"meta_info={sorted(self.meta_info)})"
        )


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pads ``data`` to a multiple of ``size_divisor`` rows by appending copies of its first rows
    (cycling when ``pad_size > B``), so each data-parallel rank gets the same number of real rows.

    Returns:
        ``(padded, pad_size)``; ``pad_size == 0`` returns ``data`` itself.

    Raises:
        ValueError: ``size_divisor < 1``, or ``data`` is empty and needs padding.
    """
    if size_divisor < 1:
        raise ValueError(f"size_divisor must be >= 1, got {size_divisor}")
    n = len(data)
    pad_size = (-n) % size_divisor
    if pad_size == 0:
        return data, 0
    if n == 0:
        raise ValueError(f"cannot pad an empty DataProto to a multiple of {size_divisor}")
    padding = data[np.arange(pad_size) % n]
    return DataProto.concat([data, padding]), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drops the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor`."""
    if pad_size < 0 or pad_size > len(data):
        raise ValueError(f"pad_size {pad_size} out of range for a DataProto of {len(data)} rows")
    return data[: len(data) - pad_size] if pad_size else data
