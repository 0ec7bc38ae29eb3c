"""The small JSON written next to every index we build, and the checks the server runs with it.

An index is only meaningful with the corpus file it was built from (row i of the index is line i of
the corpus) and, for dense indexes, with the encoder conventions used at build time. Search-R1 and
FlashRAG indexes carry no such file; they load without it and only the row count is checked.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

META_VERSION = 1


class IndexMismatchError(ValueError):
    """The corpus or encoder given to the server is not the one the index was built with."""


@dataclass
class IndexMeta:
    """How an index was built.

    Attributes:
        retrieval_method: ``bm25`` or the dense method name (``e5``, ``minilm``, a model path).
        faiss_type: the FAISS index-factory string (dense only).
        dim: vector dimension (dense only).
        encoder: the ``EncoderSpec`` as a dict (dense only).
        corpus: ``{"path", "num_rows", "first_id", "last_id"}``.
        search_params: FAISS search-time parameters the server applies (``{"nprobe": 64}`` for IVF,
            ``{"efSearch": 128}`` for HNSW); None for exact indexes.
    """

    retrieval_method: str
    corpus: dict
    faiss_type: str | None = None
    dim: int | None = None
    encoder: dict | None = None
    bm25: dict | None = None
    search_params: dict | None = None
    version: int = META_VERSION
    extra: dict = field(default_factory=dict)

    def save(self, index_path: str | os.PathLike) -> str:
        path = meta_path(index_path)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(asdict(self), handle, indent=2)
        return path

    @classmethod
    def load(cls, index_path: str | os.PathLike) -> "IndexMeta | None":
        """The meta of an index, or None when the index has none (FlashRAG/Search-R1 indexes)."""
        path = meta_path(index_path)
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def meta_path(index_path: str | os.PathLike) -> str:
    """``<dir>/search_r1_meta.json`` for an index directory (BM25), ``<file>.meta.json`` otherwise."""
    index_path = Path(index_path)
    if index_path.is_dir():
        return str(index_path / "search_r1_meta.json")
    return str(index_path) + ".meta.json"


def check_corpus(meta: IndexMeta | None, fingerprint: dict, index_size: int, index_path: str,
                 corpus_path: str) -> None:
    """Refuse a corpus that does not match the index.

    Raises:
        IndexMismatchError: row counts differ from the index size, or (with a meta) the first/last
            ids differ from those recorded at build time.
    """
    if fingerprint["num_rows"] != index_size:
        raise IndexMismatchError(
            f"corpus {corpus_path} has {fingerprint['num_rows']} rows but index {index_path} "
            f"has {index_size} entries: they were not built together")
    if meta is None:
        return
    built = meta.corpus
    for key in ("num_rows", "first_id", "last_id"):
        if built.get(key) != fingerprint[key]:
            raise IndexMismatchError(
                f"corpus {corpus_path} does not match index {index_path}: {key} is "
                f"{fingerprint[key]!r}, the index was built from {built.get('path')} with {key} "
                f"{built.get(key)!r}")


def check_encoder(meta: IndexMeta | None, retriever_name: str, retriever_model: str | None,
                  index_path: str) -> None:
    """Refuse an encoder other than the one recorded at build time.

    Model locations are compared by their last path component, so a copy of the same model in
    another directory (another machine's venv) is accepted.

    Raises:
        IndexMismatchError: the retrieval method or the model differs from the meta.
    """
    if meta is None or meta.encoder is None:
        return
    built_method = meta.retrieval_method
    if retriever_name not in (built_method, meta.encoder.get("name")) and not retriever_model:
        raise IndexMismatchError(
            f"index {index_path} was built with retrieval_method {built_method!r}, "
            f"server started with retriever_name {retriever_name!r}")
    if retriever_model:
        built_model = meta.encoder["model_path"]
        if _model_key(retriever_model) != _model_key(built_model):
            raise IndexMismatchError(
                f"index {index_path} was built with encoder {built_model!r}, "
                f"server started with retriever_model {retriever_model!r}")


def _model_key(path: str) -> str:
    return os.path.basename(os.path.normpath(path)).lower()
