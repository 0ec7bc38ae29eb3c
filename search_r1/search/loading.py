"""Load an index + corpus (+ encoder) for serving, refusing pairs that were not built together.

At wiki-18 size (21M passages) start-up is dominated by reading ~64 GB of Flat vectors and ~14 GB of
corpus text, so the corpus (memory-mapped Arrow, ``corpus``), the vectors (read in chunks straight
into their shards, ``flat_shards``/``faiss_gpu``) and the query encoder load in parallel threads.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

from .bm25 import BM25Retriever
from .corpus import load_corpus
from .dense import DenseIndex, DenseRetriever
from .encoders import Encoder, EncoderSpec, resolve_encoder_spec
from .faiss_gpu import faiss_has_gpu, flat_file_to_gpus, index_to_gpus, set_search_params
from .flat_file import METRIC_INNER_PRODUCT, open_flat_file
from .flat_shards import load_flat_shards, visible_gpus
from .index_meta import IndexMeta, check_corpus, check_encoder

GPU_SEARCH_CHOICES = ("auto", "faiss", "torch")


def resolve_gpu_search(choice: str, inner_product_flat: bool = False) -> str:
    """``faiss`` or ``torch``: who searches on the GPUs for ``--gpu_search choice``.

    ``auto``: torch's fp16 shards for a Flat inner-product index (faster through the server than
    FAISS's GPU Flat, docs/benchmarks.md "Paper scale"), FAISS's own GPU indexes for any other type
    when the installed FAISS is a GPU build, else torch.

    Raises:
        ValueError: an unknown choice, or ``faiss`` without a GPU build of FAISS.
    """
    if choice not in GPU_SEARCH_CHOICES:
        raise ValueError(f"gpu_search must be one of {GPU_SEARCH_CHOICES}, got {choice!r}")
    has_gpu_faiss = faiss_has_gpu()
    if choice == "faiss" and not has_gpu_faiss:
        import faiss

        raise ValueError(f"gpu_search 'faiss' needs a GPU build of FAISS (faiss-gpu-cuvs); the installed "
                         f"faiss {faiss.__version__} has no GPU support or sees no GPU")
    if choice == "auto":
        return "faiss" if has_gpu_faiss and not inner_product_flat else "torch"
    return choice


def load_dense_index(index_path: str, corpus_path: str, use_gpu: bool = False,
                     gpu_search: str = "auto") -> DenseIndex:
    """A FAISS index file and its corpus; works with or without our meta JSON (FlashRAG indexes).

    ``use_gpu``: the vectors on all visible GPUs, sharded, in fp16; searched by FAISS's GPU indexes
    or by torch (Flat inner-product indexes; see ``flat_shards``) as ``gpu_search`` says. Without
    ``use_gpu`` a Flat inner-product index is searched with torch on the CPU, any other type by FAISS.
    The result's ``load_s`` holds the seconds each part took.

    Raises:
        FileNotFoundError: missing index or corpus file.
        IndexMismatchError: the corpus is not the one the index was built from.
        RuntimeError: ``use_gpu`` and no visible GPU.
        ValueError: an index type the chosen GPU search cannot serve.
        FlatFileError: a truncated or inconsistent Flat index file.
    """
    for path, what in ((index_path, "index"), (corpus_path, "corpus")):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{what} file not found: {path}")
    gpus = visible_gpus() if use_gpu else []
    if use_gpu and not gpus:
        raise RuntimeError(f"--faiss_gpu given but no GPU is visible (serving {index_path})")
    if gpu_search not in GPU_SEARCH_CHOICES:
        raise ValueError(f"gpu_search must be one of {GPU_SEARCH_CHOICES}, got {gpu_search!r}")
    meta = IndexMeta.load(index_path)
    with ThreadPoolExecutor(1, thread_name_prefix="corpus") as pool:
        corpus_job = pool.submit(_timed, load_corpus, corpus_path)
        (vectors, faiss_gpus), vectors_s = _timed(_load_vectors, index_path, gpu_search if use_gpu else None,
                                                  gpus, meta)
        corpus, corpus_s = corpus_job.result()
    check_corpus(meta, corpus.fingerprint(), int(vectors.ntotal), index_path, corpus_path)
    dense = DenseIndex(vectors, corpus, faiss_gpus=faiss_gpus)
    # Microsecond resolution: a small part on a fast host must not read 0.
    dense.load_s = {"corpus": round(corpus_s, 6), "vectors": round(vectors_s, 6)}
    return dense


def _timed(fn, *args):
    start = time.perf_counter()
    return fn(*args), time.perf_counter() - start


def _load_vectors(index_path: str, gpu_search: str | None, gpus: list[str], meta: IndexMeta | None):
    """``(FlatShards or FAISS index, FAISS GPU ids or None)``: on the CPU (``gpu_search`` None) or
    on the GPUs by the backend :func:`resolve_gpu_search` picks."""
    import faiss

    flat = open_flat_file(index_path)
    inner_product_flat = flat is not None and flat.metric_type == METRIC_INNER_PRODUCT
    backend = "cpu" if gpu_search is None else resolve_gpu_search(gpu_search, inner_product_flat)
    params = meta.search_params if meta is not None else None
    if backend == "torch" or (backend == "cpu" and inner_product_flat):
        if not inner_product_flat:
            with open(index_path, "rb") as handle:
                fourcc = handle.read(4)
            raise ValueError(f"GPU search with torch supports Flat inner-product indexes only, and "
                             f"{index_path} is FAISS type {fourcc!r}: install faiss-gpu-cuvs "
                             f"(--gpu_search faiss) or serve on the CPU")
        return load_flat_shards(flat, gpus or ["cpu"]), None
    if backend == "cpu":
        index = faiss.read_index(index_path)
        set_search_params(index, params, on_gpu=False)
        return index, None
    gpu_ids = [int(g.split(":")[1]) for g in gpus]
    if flat is not None:
        return flat_file_to_gpus(flat, gpu_ids), gpu_ids
    index = index_to_gpus(faiss.read_index(index_path), gpu_ids)
    set_search_params(index, params, on_gpu=True)
    return index, gpu_ids


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
                         query_max_length: int | None = None, gpu_search: str = "auto") -> DenseRetriever:
    """Index, corpus and query encoder, checked against each other (see ``index_meta``); the encoder
    loads while the index does. ``describe()["load_s"]`` gives the seconds of each part."""
    start = time.perf_counter()
    spec = encoder_spec_for(index_path, retriever_name, retriever_model, pooling_method, query_max_length)
    device = "cuda" if faiss_gpu else "cpu"
    with ThreadPoolExecutor(1, thread_name_prefix="encoder") as pool:
        encoder_job = pool.submit(_timed, Encoder, spec, device, faiss_gpu)
        dense_index = load_dense_index(index_path, corpus_path, use_gpu=faiss_gpu, gpu_search=gpu_search)
        encoder, encoder_s = encoder_job.result()
    retriever = DenseRetriever(dense_index, encoder)
    retriever.load_s = {**dense_index.load_s, "encoder": round(encoder_s, 6),
                        "total": round(time.perf_counter() - start, 6)}
    return retriever


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
