"""Passage corpus: JSONL rows ``{"id", "contents"}`` served from a memory-mapped Arrow file.

wiki-18 has 21M passages (~14 GB of text). A list of Python dicts would cost several times that, and
even one parsed copy per server process is 14 GB of private memory. So on first load the JSONL is
converted, batch by batch (pyarrow's streaming JSON reader), into an Arrow IPC file beside it
(``corpus.jsonl.arrow``), and every load memory-maps that file: the next start takes seconds, rows
are read from the page cache only when a search returns them, and several server processes share
the same pages. Only when the fast reader rejects the file do we scan it line by line, to report
which line is wrong (pyarrow's own message names neither) or to accept integer ids.

The Arrow file records the JSONL's size and modification time; a changed JSONL, or an Arrow file
that is truncated or not Arrow at all, is rebuilt. Where the JSONL's folder has no write bits (a
read-only data set) the Arrow file goes to ``$SEARCH_R1_CACHE/corpus_arrow/`` instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import stat
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

REQUIRED_FIELDS = ("id", "contents")
ARROW_FORMAT = "search_r1.corpus/1"  # schema metadata of the Arrow files we write
JSON_BLOCK_BYTES = 1 << 24
SLOW_PATH_BATCH_ROWS = 65536

logger = logging.getLogger(__name__)


class CorpusFormatError(ValueError):
    """A corpus file is malformed; the message names the file and the 1-based line."""


class Corpus:
    """A passage table indexed by FAISS/BM25 row number (in memory or memory-mapped Arrow).

    Row ``i`` of the corpus is row ``i`` of the index built from it, so the corpus must be passed in
    the same file order as at build time.
    """

    def __init__(self, ids: pa.ChunkedArray | pa.Array, contents: pa.ChunkedArray | pa.Array,
                 path: str = "<memory>"):
        if len(ids) != len(contents):
            raise ValueError(f"{path}: {len(ids)} ids but {len(contents)} contents")
        self._set_table(pa.table({"id": ids, "contents": contents}), path)

    @classmethod
    def from_table(cls, table: pa.Table, path: str) -> "Corpus":
        """Wrap a table with string ``id`` and ``contents`` columns (no copy)."""
        self = cls.__new__(cls)
        self._set_table(table.select(list(REQUIRED_FIELDS)), path)
        return self

    def _set_table(self, table: pa.Table, path: str) -> None:
        self._table, self.path = table, path
        self.arrow_path: str | None = None  # the memory-mapped Arrow file, when there is one
        batches = [b for b in table.to_batches() if b.num_rows]
        # Table.take concatenates chunked columns (a full copy per call, and an offset overflow past
        # 2 GiB of text): rows are fetched per record batch instead.
        self._ids = [b.column(0) for b in batches]
        self._texts = [b.column(1) for b in batches]
        self._starts = np.cumsum([0] + [b.num_rows for b in batches[:-1]], dtype=np.int64)

    @classmethod
    def from_rows(cls, rows: Sequence[dict], path: str = "<memory>") -> "Corpus":
        """Build a corpus from ``{"id", "contents"}`` dicts (tests, small in-memory corpora)."""
        for line, row in enumerate(rows, start=1):
            _check_row(row, path, line)
        return cls(pa.array([str(r["id"]) for r in rows], pa.string()),
                   pa.array([r["contents"] for r in rows], pa.string()), path)

    def __len__(self) -> int:
        return self._table.num_rows

    @property
    def ids(self) -> pa.ChunkedArray:
        return self._table.column("id")

    @property
    def contents(self) -> pa.ChunkedArray:
        return self._table.column("contents")

    def __getitem__(self, index: int) -> dict:
        return self.take([index])[0]

    def take(self, indices: Iterable[int]) -> list[dict]:
        """Documents ``{"id", "contents"}`` at the given row numbers, in that order.

        Raises:
            IndexError: a row number outside ``[0, len)``.
        """
        rows = np.fromiter(indices, dtype=np.int64)
        if rows.size == 0:
            return []
        bad = rows[(rows < 0) | (rows >= len(self))]
        if bad.size:
            raise IndexError(f"row {int(bad[0])} outside corpus {self.path} ({len(self)} rows)")
        batch = np.searchsorted(self._starts, rows, side="right") - 1
        local = rows - self._starts[batch]
        return [{"id": self._ids[b][i].as_py(), "contents": self._texts[b][i].as_py()}
                for b, i in zip(batch.tolist(), local.tolist())]

    def iter_contents(self, batch_size: int = 4096) -> Iterable[list[str]]:
        """The ``contents`` column in batches of Python strings (for encoding without a full copy)."""
        for batch in self._table.select(["contents"]).to_batches(max_chunksize=batch_size):
            yield batch.column(0).to_pylist()

    def fingerprint(self) -> dict:
        """Row count and first/last id: enough to catch an index paired with the wrong corpus."""
        n = len(self)
        return {"num_rows": n, "first_id": self[0]["id"] if n else None,
                "last_id": self[n - 1]["id"] if n else None}


def load_corpus(path: str | os.PathLike, arrow_cache: bool = True) -> Corpus:
    """Load a corpus: a JSONL file (one ``{"id", "contents"}`` object per line; other keys are
    ignored) or an Arrow IPC file written by ``convert_jsonl_to_arrow``.

    With ``arrow_cache`` (the default) a JSONL corpus is served from its memory-mapped Arrow copy,
    written on first use (see the module docstring); without it the JSONL is parsed into memory.

    Raises:
        FileNotFoundError: no such file.
        CorpusFormatError: a line is not a JSON object, lacks ``id``/``contents``, or ``contents`` is
            not a string (the message gives the file and line number); an ``.arrow`` corpus that is
            not a valid corpus Arrow file.
    """
    path = str(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    if path.endswith(".arrow"):
        return open_arrow_corpus(path)
    if not arrow_cache:
        return _load_jsonl_in_memory(path)
    arrow = arrow_path_for(path)
    corpus = _open_if_current(arrow, path)
    if corpus is not None:
        return corpus
    try:
        os.makedirs(os.path.dirname(arrow), exist_ok=True)
        with open(path, "rb") as source:
            fcntl.flock(source.fileno(), fcntl.LOCK_EX)  # another process may be converting it
            corpus = _open_if_current(arrow, path)
            if corpus is None:
                convert_jsonl_to_arrow(path, arrow)
                corpus = open_arrow_corpus(arrow, source=path)
    except OSError as err:
        logger.warning("corpus %s: cannot write its Arrow copy %s (%s); parsing it into memory",
                       path, arrow, err)
        return _load_jsonl_in_memory(path)
    return corpus


def arrow_path_for(jsonl_path: str) -> str:
    """Where the Arrow copy of a JSONL corpus lives: beside it, or in the cache when the folder has
    no write bits (root ignores permissions, so the bits are read rather than ``os.access``)."""
    folder = os.path.dirname(os.path.abspath(jsonl_path))
    if os.stat(folder).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) and os.access(folder, os.W_OK):
        return os.path.abspath(jsonl_path) + ".arrow"
    from verl.utils.model_zoo import cache_root

    digest = hashlib.sha1(os.path.realpath(jsonl_path).encode()).hexdigest()[:12]
    return str(cache_root() / "corpus_arrow" / f"{os.path.basename(jsonl_path)}.{digest}.arrow")


def _source_stamp(jsonl_path: str) -> dict[str, str]:
    info = os.stat(jsonl_path)
    return {"source_size": str(info.st_size), "source_mtime_ns": str(info.st_mtime_ns)}


def _open_if_current(arrow: str, jsonl_path: str) -> Corpus | None:
    """The mapped Arrow copy if it exists, is valid and matches the JSONL; None (logged) otherwise."""
    if not os.path.exists(arrow):
        return None
    try:
        return open_arrow_corpus(arrow, source=jsonl_path)
    except CorpusFormatError as err:
        logger.warning("rebuilding the Arrow copy of %s: %s", jsonl_path, err)
        return None


def open_arrow_corpus(path: str, source: str | None = None) -> Corpus:
    """Memory-map a corpus Arrow IPC file (zero-copy; pages are read when rows are).

    Args:
        source: the JSONL it must have been converted from (its size and mtime are checked).
    Raises:
        CorpusFormatError: not an Arrow IPC file, truncated, not written by ``convert_jsonl_to_arrow``,
            or (with ``source``) stale.
    """
    try:
        reader = pa.ipc.open_file(pa.memory_map(path, "r"))
        table = reader.read_all()
        table.validate()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as err:
        raise CorpusFormatError(f"{path}: not a valid Arrow corpus file ({err})") from None
    meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
    if meta.get("format") != ARROW_FORMAT or table.column_names[:2] != list(REQUIRED_FIELDS):
        raise CorpusFormatError(f"{path}: not a search-r1 corpus Arrow file (format "
                                f"{meta.get('format')!r}, columns {table.column_names})")
    if source is not None:
        stamp = _source_stamp(source)
        if any(meta.get(k) != v for k, v in stamp.items()):
            raise CorpusFormatError(f"{path} is stale: {source} changed since it was converted")
    corpus = Corpus.from_table(table, source or path)
    corpus.arrow_path = path
    return corpus


def convert_jsonl_to_arrow(jsonl_path: str, arrow_path: str) -> int:
    """Convert a JSONL corpus to an uncompressed Arrow IPC file, one block of rows at a time.

    Written to ``<arrow_path>.tmp.<pid>`` and renamed when complete, so readers never see a partial
    file. Returns the row count.

    Raises:
        CorpusFormatError: a malformed line (file and line named).
    """
    tmp = f"{arrow_path}.tmp.{os.getpid()}"
    stamp = _source_stamp(jsonl_path)
    try:
        try:
            rows = _write_arrow(tmp, _fast_batches(jsonl_path), stamp)
        except (pa.ArrowInvalid, pa.ArrowTypeError, CorpusFormatError):
            # Either a line is bad (raise naming it) or ids are ints, which the string schema rejects.
            rows = _write_arrow(tmp, _slow_batches(jsonl_path), stamp)
        os.replace(tmp, arrow_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return rows


_SCHEMA = pa.schema([("id", pa.string()), ("contents", pa.string())])


def _write_arrow(path: str, batches: Iterable[pa.RecordBatch], stamp: dict[str, str]) -> int:
    rows = 0
    with pa.OSFile(path, "wb") as sink:
        with pa.ipc.new_file(sink, _SCHEMA.with_metadata({"format": ARROW_FORMAT, **stamp})) as writer:
            for batch in batches:
                writer.write_batch(batch)
                rows += batch.num_rows
    return rows


def _fast_batches(path: str) -> Iterable[pa.RecordBatch]:
    """Record batches from pyarrow's streaming JSON reader (only id/contents are parsed: other
    keys, e.g. title or embeddings, would cost memory)."""
    options = pa_json.ParseOptions(explicit_schema=_SCHEMA, unexpected_field_behavior="ignore")
    reader = pa_json.open_json(path, read_options=pa_json.ReadOptions(block_size=JSON_BLOCK_BYTES),
                               parse_options=options)
    for batch in reader:
        if batch.column(0).null_count or batch.column(1).null_count:
            raise CorpusFormatError(f"{path}: null or missing id or contents")
        yield pa.record_batch([batch.column(0), batch.column(1)], schema=_SCHEMA)


def _slow_batches(path: str) -> Iterable[pa.RecordBatch]:
    """Record batches parsed line by line; raises CorpusFormatError at the first malformed line."""
    ids: list[str] = []
    contents: list[str] = []
    with open(path, "r", encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise CorpusFormatError(f"{path}:{line_no}: invalid JSON ({err.msg})") from None
            _check_row(row, path, line_no)
            ids.append(str(row["id"]))
            contents.append(row["contents"])
            if len(ids) == SLOW_PATH_BATCH_ROWS:
                yield pa.record_batch([pa.array(ids, pa.string()), pa.array(contents, pa.string())], schema=_SCHEMA)
                ids, contents = [], []
    if ids:
        yield pa.record_batch([pa.array(ids, pa.string()), pa.array(contents, pa.string())], schema=_SCHEMA)


def _load_jsonl_in_memory(path: str) -> Corpus:
    """Parse a JSONL corpus into memory (no Arrow copy on disk)."""
    try:
        batches = list(_fast_batches(path))
    except (pa.ArrowInvalid, pa.ArrowTypeError, CorpusFormatError):
        batches = list(_slow_batches(path))
    return Corpus.from_table(pa.Table.from_batches(batches, schema=_SCHEMA), path)




def write_corpus(rows: Iterable[dict], path: str | os.PathLike) -> None:
    """Write ``{"id", "contents"}`` rows as JSONL."""
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({"id": row["id"], "contents": row["contents"]}, ensure_ascii=False) + "\n")


def _check_row(row, path: str, line_no: int) -> None:
    if not isinstance(row, dict):
        raise CorpusFormatError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
    for field in REQUIRED_FIELDS:
        if field not in row or row[field] is None:
            raise CorpusFormatError(f"{path}:{line_no}: missing field {field!r}")
    if not isinstance(row["contents"], str):
        raise CorpusFormatError(
            f"{path}:{line_no}: 'contents' must be a string, got {type(row['contents']).__name__}")
    if not isinstance(row["id"], (str, int)):
        raise CorpusFormatError(f"{path}:{line_no}: 'id' must be a string or int, got {type(row['id']).__name__}")
