"""Load an index + corpus (+ encoder) for serving, refusing pairs that were not built together."""

from __future__ import annotations

import os

from .bm25 import BM25Retriever
from .corpus import load_corpus
from .dense import DenseIndex, DenseRetriever, faiss_has_gpu, load_faiss_index
from .flat_shards import visible_gpus
from .encoders import Encoder, EncoderSpec, resolve_encoder_spec
from .index_meta import IndexMeta, check_corpus, check_encoder


def load_dense_index(index_path: str, corpus_path: str, use_gpu: bool = False) -> DenseIndex:
    """A FAISS index and its corpus; works with or without our meta JSON (FlashRAG indexes).

    ``use_gpu``: the index on all visible GPUs in fp16, sharded, through faiss-gpu when installed,
    else through torch (Flat inner-product indexes; see ``flat_shards``).

    Raises:
        FileNotFoundError: missing index or corpus file.
        IndexMismatchError: the corpus is not the one the index was built from.
        RuntimeError: ``use_gpu`` and no visible GPU.
    """
    if not os.path.isfile(index_path):
        raise FileNotFoundError(f"index file not found: {index_path}")
    corpus = load_corpus(corpus_path)
    index = load_faiss_index(index_path, use_gpu=use_gpu)
    check_corpus(IndexMeta.load(index_path), corpus.fingerprint(), int(index.ntotal), index_path, corpus_path)
    torch_devices = None
    if use_gpu and not faiss_has_gpu():
        torch_devices = visible_gpus()
        if not torch_devices:
            raise RuntimeError(f"--faiss_gpu given but no GPU is visible (serving {index_path})")
    return DenseIndex(index, corpus, torch_devices=torch_devices)


def encoder_spec_for(index_path: str, retriever_name: str, retriever_model: str | None = None,
                     pooling_method: str | None = None, query_max_length: int | None = None) -> EncoderSpec:
    """The query encoder conventions: the index meta's when present, else the named preset's.

    Raises:
        IndexMismatchError: the named retriever/model differs from the one in the meta.
    """
    meta = IndexMeta.load(index_path)
    check_encoder(meta, retriever_name, retriever_model, index_path)
    if meta is None or meta.encoder is None:
        return resolve_encoder_spec(retriever_name, retriever_model, pooling_method, query_max_length)
    spec = EncoderSpec.from_dict(meta.encoder)
    if retriever_model:
        spec.model_path = retriever_model
    elif not os.path.exists(spec.model_path) and spec.name != "custom":
        # A preset built on another machine: its local model folder is elsewhere here.
        spec.model_path = resolve_encoder_spec(spec.name).model_path
    if query_max_length:
        spec.max_length = query_max_length
    return spec


def load_dense_retriever(index_path: str, corpus_path: str, retriever_name: str,
                         retriever_model: str | None = None, faiss_gpu: bool = False,
                         pooling_method: str | None = None,
                         query_max_length: int | None = None) -> DenseRetriever:
    """Index, corpus and query encoder, checked against each other (see ``index_meta``)."""
    spec = encoder_spec_for(index_path, retriever_name, retriever_model, pooling_method, query_max_length)
    dense_index = load_dense_index(index_path, corpus_path, use_gpu=faiss_gpu)
    device = "cuda" if faiss_gpu else "cpu"
    return DenseRetriever(dense_index, Encoder(spec, device=device, use_fp16=faiss_gpu))


def load_bm25_retriever(index_path: str, corpus_path: str) -> BM25Retriever:
    """A saved bm25s index and its corpus.

    Raises:
        FileNotFoundError: not a bm25s index directory.
        IndexMismatchError: the corpus is not the one the index was built from.
    """
    import json

    params_path = os.path.join(index_path, "params.index.json")
    if not os.path.isfile(params_path):
        raise FileNotFoundError(f"BM25 index directory not found (no {params_path})")
    with open(params_path) as handle:
        num_docs = int(json.load(handle).get("num_docs", -1))
    corpus = load_corpus(corpus_path)
    check_corpus(IndexMeta.load(index_path), corpus.fingerprint(), num_docs, index_path, corpus_path)
    return BM25Retriever.load(index_path, corpus)
