"""FAISS ``IndexFlat`` files read and written in row chunks, without FAISS holding the whole index.

``faiss.read_index`` on wiki-18's ``e5_Flat.index`` (21M x 768 float32, ~64 GB) allocates the whole
matrix in host memory before anything can be moved to a GPU. The file's layout is simple and stable
(``faiss/impl/index_write.cpp``, ``write_index`` for ``IndexFlat``; unchanged since FAISS 1.5), so the
rows can be read straight from it, a chunk at a time, into their final place (fp16 GPU shards).

Layout, little-endian::

    fourcc       4 bytes   b"IxFI" (inner product), b"IxF2" (L2), b"IxFl" (any other metric)
    d            int32
    ntotal       int64
    dummy        int64 x 2 (unused by FAISS)
    is_trained   uint8
    metric_type  int32     (0 inner product, 1 L2, ...)
    metric_arg   float32   only when metric_type > 1
    size         uint64    number of floats that follow, ntotal * d
    codes        float32   (ntotal, d), row-major

The tests check this reader against ``faiss.read_index`` on FAISS-written files.
"""

from __future__ import annotations

import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

FLAT_FOURCCS = {b"IxFI": "IndexFlatIP", b"IxF2": "IndexFlatL2", b"IxFl": "IndexFlat"}
METRIC_INNER_PRODUCT, METRIC_L2 = 0, 1
_HEADER = struct.Struct("<4si q qq ? i")  # fourcc, d, ntotal, dummy x2, is_trained, metric_type
_DUMMY = 1 << 20  # what FAISS writes in the two unused header fields
READ_PIECE_BYTES = 1 << 30  # one preadv call reads at most this much (Linux caps a call near 2 GiB)


class FlatFileError(ValueError):
    """A file claims to be a FAISS Flat index but its header or size is wrong; names the file."""


@dataclass(frozen=True)
class FlatFile:
    """The header of a FAISS Flat index file and where its float32 rows start.

    Attributes:
        path: the file.
        dim: vector dimension ``d``.
        ntotal: number of stored vectors.
        metric_type: FAISS metric (0 inner product, 1 L2).
        data_offset: byte offset of row 0.
    """

    path: str
    dim: int
    ntotal: int
    metric_type: int
    data_offset: int

    @property
    def row_bytes(self) -> int:
        return 4 * self.dim

    @property
    def data_bytes(self) -> int:
        return self.ntotal * self.row_bytes

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Fill ``out`` (a C-contiguous float32 ``(rows, dim)`` array) with rows ``start:start+rows``.

        Raises:
            ValueError: ``out`` has the wrong dtype/shape/layout or the rows run past ``ntotal``.
            FlatFileError: the file ended early (it shrank after it was opened).
        """
        if out.dtype != np.float32 or out.ndim != 2 or out.shape[1] != self.dim or not out.flags.c_contiguous:
            raise ValueError(f"read_into needs a C-contiguous float32 (rows, {self.dim}) array, "
                             f"got {out.dtype} {out.shape}")
        if start < 0 or start + out.shape[0] > self.ntotal:
            raise ValueError(f"rows {start}:{start + out.shape[0]} outside {self.path} ({self.ntotal} rows)")
        view = memoryview(out).cast("B")
        offset = self.data_offset + start * self.row_bytes
        with open(self.path, "rb", buffering=0) as handle:
            fd, done = handle.fileno(), 0
            while done < len(view):
                piece = view[done:done + READ_PIECE_BYTES]
                got = os.preadv(fd, [piece], offset + done)
                if got <= 0:
                    raise FlatFileError(f"{self.path}: file ended at byte {offset + done}, "
                                        f"expected {self.data_offset + self.data_bytes}")
                done += got

    def read_rows(self, start: int, stop: int, threads: int = 1) -> np.ndarray:
        """Rows ``start:stop`` as a new float32 array, read by ``threads`` parallel readers."""
        out = np.empty((stop - start, self.dim), dtype=np.float32)
        self.read_parallel(start, out, threads)
        return out

    def read_parallel(self, start: int, out: np.ndarray, threads: int) -> None:
        """``read_into`` split over ``threads`` threads (reads release the GIL; a page-cache-warm
        file is copied several times faster by a few threads than by one)."""
        rows = out.shape[0]
        threads = max(1, min(threads, rows // 1024 or 1))
        if threads == 1:
            self.read_into(start, out)
            return
        bounds = np.linspace(0, rows, threads + 1).astype(int)
        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(self.read_into, start + int(lo), out[lo:hi])
                       for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
            for future in futures:
                future.result()

    def iter_chunks(self, rows_per_chunk: int, start: int = 0, stop: int | None = None
                    ) -> Iterator[tuple[int, np.ndarray]]:
        """``(first_row, rows)`` for consecutive chunks of ``start:stop``; each array is new."""
        stop = self.ntotal if stop is None else stop
        for lo in range(start, stop, rows_per_chunk):
            yield lo, self.read_rows(lo, min(lo + rows_per_chunk, stop))

    def memmap(self) -> np.ndarray:
        """A read-only ``(ntotal, dim)`` float32 memory map of the rows (may be unaligned)."""
        return np.memmap(self.path, dtype=np.float32, mode="r", offset=self.data_offset,
                         shape=(self.ntotal, self.dim))


def open_flat_file(path: str | os.PathLike) -> FlatFile | None:
    """The header of a FAISS Flat index file, or None when the file is another index type.

    Raises:
        FileNotFoundError: no such file.
        FlatFileError: a Flat fourcc with an inconsistent header, or a file whose size is not the
            header's plus ``ntotal * d`` floats (truncated or trailing bytes).
    """
    path = str(path)
    with open(path, "rb") as handle:
        head = handle.read(_HEADER.size + 4 + 8)
    if len(head) < 4 or head[:4] not in FLAT_FOURCCS:
        return None
    if len(head) < _HEADER.size + 8:
        raise FlatFileError(f"{path}: truncated FAISS Flat header ({len(head)} bytes)")
    fourcc, dim, ntotal, _, _, _, metric_type = _HEADER.unpack_from(head)
    offset = _HEADER.size + (4 if metric_type > 1 else 0)
    (num_floats,) = struct.unpack_from("<Q", head, offset)
    offset += 8
    if dim <= 0 or ntotal < 0 or num_floats != dim * ntotal:
        raise FlatFileError(f"{path}: inconsistent FAISS Flat header (d={dim}, ntotal={ntotal}, "
                            f"{num_floats} floats)")
    expected = offset + 4 * num_floats
    size = os.path.getsize(path)
    if size != expected:
        raise FlatFileError(f"{path}: {size} bytes but a {ntotal} x {dim} Flat index takes {expected} "
                            f"bytes: {'truncated' if size < expected else 'trailing data'}")
    return FlatFile(path, int(dim), int(ntotal), int(metric_type), offset)


def write_flat_file(path: str | os.PathLike, dim: int, ntotal: int, chunks: Iterable[np.ndarray],
                    metric_type: int = METRIC_INNER_PRODUCT) -> FlatFile:
    """Write a FAISS-readable Flat index from row chunks, holding one chunk at a time.

    Args:
        path: destination; written to ``<path>.tmp`` and renamed when complete.
        dim, ntotal: shape of the whole matrix (the header comes first).
        chunks: float32-convertible ``(rows, dim)`` arrays, in row order, ``ntotal`` rows in all.
        metric_type: 0 inner product (``IndexFlatIP``, the retrievers' metric) or 1 L2.
    Raises:
        ValueError: a chunk of the wrong width, or the chunks do not add up to ``ntotal`` rows.
    """
    if metric_type not in (METRIC_INNER_PRODUCT, METRIC_L2):
        raise ValueError(f"write_flat_file supports inner product (0) and L2 (1), not metric {metric_type}")
    fourcc = b"IxFI" if metric_type == METRIC_INNER_PRODUCT else b"IxF2"
    path = str(path)
    tmp = path + ".tmp"
    written = 0
    try:
        with open(tmp, "wb") as handle:
            handle.write(_HEADER.pack(fourcc, dim, ntotal, _DUMMY, _DUMMY, True, metric_type))
            handle.write(struct.pack("<Q", dim * ntotal))
            for chunk in chunks:
                chunk = np.ascontiguousarray(chunk, dtype=np.float32)
                if chunk.ndim != 2 or chunk.shape[1] != dim:
                    raise ValueError(f"{path}: chunk of shape {chunk.shape}, expected (rows, {dim})")
                written += chunk.shape[0]
                if written > ntotal:
                    raise ValueError(f"{path}: chunks hold more than the declared {ntotal} rows")
                handle.write(memoryview(chunk).cast("B"))
        if written != ntotal:
            raise ValueError(f"{path}: chunks hold {written} rows, the header declares {ntotal}")
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    os.replace(tmp, path)
    return open_flat_file(path)
