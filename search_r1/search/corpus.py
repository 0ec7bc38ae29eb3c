"""Passage corpus: JSONL rows ``{"id", "contents"}`` held once, as Arrow string columns.

wiki-18 has 21M passages (~14 GB of text). A list of Python dicts would cost several times that, so
the file is parsed by pyarrow's JSON reader straight into two Arrow columns and rows are materialised
only when a search returns them. Only when the fast reader rejects the file do we scan it line by
line, to report which line is wrong (pyarrow's own message names neither).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

REQUIRED_FIELDS = ("id", "contents")


class CorpusFormatError(ValueError):
    """A corpus file is malformed; the message names the file and the 1-based line."""


class Corpus:
    """An in-memory passage table indexed by FAISS/BM25 row number.

    Row ``i`` of the corpus is row ``i`` of the index built from it, so the corpus must be passed in
    the same file order as at build time.
    """

    def __init__(self, ids: pa.ChunkedArray | pa.Array, contents: pa.ChunkedArray | pa.Array,
                 path: str = "<memory>"):
        if len(ids) != len(contents):
            raise ValueError(f"{path}: {len(ids)} ids but {len(contents)} contents")
        self._table = pa.table({"id": ids, "contents": contents})
        self.path = path

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
        """Documents ``{"id", "contents"}`` at the given row numbers, in that order."""
        rows = self._table.take(pa.array(list(indices), pa.int64()))
        return rows.to_pylist()

    def iter_contents(self, batch_size: int = 4096) -> Iterable[list[str]]:
        """The ``contents`` column in batches of Python strings (for encoding without a full copy)."""
        for batch in self._table.select(["contents"]).to_batches(max_chunksize=batch_size):
            yield batch.column(0).to_pylist()

    def fingerprint(self) -> dict:
        """Row count and first/last id: enough to catch an index paired with the wrong corpus."""
        n = len(self)
        return {"num_rows": n, "first_id": self.ids[0].as_py() if n else None,
                "last_id": self.ids[n - 1].as_py() if n else None}


def load_corpus(path: str | os.PathLike) -> Corpus:
    """Load a JSONL corpus (one ``{"id", "contents"}`` object per line; other keys are ignored).

    Raises:
        FileNotFoundError: no such file.
        CorpusFormatError: a line is not a JSON object, lacks ``id``/``contents``, or ``contents`` is
            not a string; the message gives the file and line number.
    """
    path = str(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    # Only id/contents are parsed: other keys (title, text, embeddings...) would cost memory.
    schema = pa.schema([("id", pa.string()), ("contents", pa.string())])
    parse_options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = pa_json.read_json(path, read_options=pa_json.ReadOptions(block_size=1 << 24),
                                  parse_options=parse_options)
        return _from_table(table, path)
    except (pa.ArrowInvalid, pa.ArrowTypeError, CorpusFormatError):
        # Slow path: either a line is bad (raise naming it) or ids are ints, which Arrow's
        # explicit string schema rejects but which we accept.
        return _load_line_by_line(path)


def concat_corpora(paths: Sequence[str | os.PathLike]) -> Corpus:
    """Load several corpus files as one, in the given order (ids must be unique across them)."""
    parts = [load_corpus(p) for p in paths]
    ids = pa.chunked_array([c for part in parts for c in part.ids.chunks], pa.string())
    contents = pa.chunked_array([c for part in parts for c in part.contents.chunks], pa.string())
    return Corpus(ids, contents, "+".join(str(p) for p in paths))


def write_corpus(rows: Iterable[dict], path: str | os.PathLike) -> None:
    """Write ``{"id", "contents"}`` rows as JSONL."""
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({"id": row["id"], "contents": row["contents"]}, ensure_ascii=False) + "\n")


def _from_table(table: pa.Table, path: str) -> Corpus:
    missing = [f for f in REQUIRED_FIELDS if f not in table.column_names]
    if missing:
        raise CorpusFormatError(f"{path}: missing field(s) {missing}")
    contents = table.column("contents")
    if not pa.types.is_string(contents.type) and not pa.types.is_large_string(contents.type):
        raise CorpusFormatError(f"{path}: 'contents' must be a string, got {contents.type}")
    if contents.null_count or table.column("id").null_count:
        raise CorpusFormatError(f"{path}: null id or contents")
    # Integer ids (some FlashRAG corpora) become strings so the API always returns str ids.
    ids = pc.cast(table.column("id"), pa.string())
    return Corpus(ids, contents, path)


def _load_line_by_line(path: str) -> Corpus:
    """Parse the file line by line, raising CorpusFormatError at the first malformed line."""
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
    return Corpus(pa.array(ids, pa.string()), pa.array(contents, pa.string()), path)


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
