"""Build a dense FAISS or BM25 index over a JSONL corpus (CLI compatible with Search-R1's builder).

    python -m search_r1.search.index_builder --retrieval_method minilm \
        --corpus_path example/corpus.jsonl --save_dir indexes/ --faiss_type Flat

writes ``indexes/minilm_Flat.index`` plus ``indexes/minilm_Flat.index.meta.json``; with
``--retrieval_method bm25`` it writes the directory ``indexes/bm25/``. A Flat index is written to
disk chunk by chunk as passages are encoded, so only one chunk of embeddings is in memory (wiki-18's
Flat index is 64 GB). Other types (``IVF4096,PQ64``, ``HNSW32``, ``CAGRA``) are built from a Flat
file: the passages are encoded into a temporary one first, or ``--from_flat`` names an existing one
(no re-encoding); training uses a random sample (``--train_size``), the recall@10 against exact
search is measured (``--recall_queries``) and written to the meta with the search parameters
(``--nprobe``, ``--ef_search``) the server will apply:

    python -m search_r1.search.index_builder --retrieval_method e5 --from_flat indexes/e5_Flat.index \
        --save_dir indexes --faiss_type IVF16384,PQ96 --nprobe 64
"""

from __future__ import annotations

import argparse
import os
import sys


from .ann import build_from_flat, measure_recall
from .bm25 import BM25Retriever
from .corpus import Corpus, load_corpus
from .encoders import POOLING_METHODS, Encoder, EncoderSpec, resolve_encoder_spec
from .faiss_gpu import set_search_params
from .flat_file import open_flat_file, write_flat_file
from .index_meta import IndexMeta

CHUNK_PASSAGES = 8192  # passages encoded before being handed to FAISS or written to the Flat file


def index_file_name(retrieval_method: str, faiss_type: str) -> str:
    """FlashRAG's naming: ``{method}_{faiss_type}.index`` (``e5_Flat.index``)."""
    method = os.path.basename(os.path.normpath(retrieval_method))
    return f"{method}_{faiss_type.replace(',', '_')}.index"


def encode_to_flat(corpus: Corpus, encoder: Encoder, path: str, batch_size: int = 64,
                   show_progress: bool = True):
    """Encode every passage into a FAISS Flat inner-product file, one chunk in memory at a time."""
    from tqdm import tqdm

    bar = tqdm(total=len(corpus), desc="encoding passages", unit="psg", disable=not show_progress)
    chunks = (encoder.encode(texts, is_query=False, batch_size=batch_size, progress=bar)
              for texts in corpus.iter_contents(CHUNK_PASSAGES))
    flat = write_flat_file(path, encoder.dim, len(corpus), chunks)
    bar.close()
    return flat


def build_dense(corpus_path: str, save_dir: str, retrieval_method: str, model_path: str | None = None,
                faiss_type: str = "Flat", pooling_method: str | None = None, max_length: int | None = None,
                batch_size: int = 64, use_fp16: bool = False, device: str | None = None,
                show_progress: bool = True, ann: dict | None = None) -> str:
    """Build, save and describe a dense index; returns the index file path.

    ``ann``: options for non-Flat types (``train_size``, ``search_params``, ``recall_queries``).
    """
    corpus = load_corpus(corpus_path)
    spec = resolve_encoder_spec(retrieval_method, model_path, pooling_method, max_length)
    encoder = Encoder(spec, device=device or _default_device(), use_fp16=use_fp16)
    os.makedirs(save_dir, exist_ok=True)
    index_path = os.path.join(save_dir, index_file_name(retrieval_method, faiss_type))
    meta = _meta(retrieval_method, corpus, corpus_path, faiss_type=faiss_type, dim=encoder.dim, encoder=spec)
    if faiss_type == "Flat":
        encode_to_flat(corpus, encoder, index_path, batch_size, show_progress)
        meta.save(index_path)
        return index_path
    flat_path = os.path.join(save_dir, f".{os.path.basename(index_path)}.vectors.tmp")
    try:
        flat = encode_to_flat(corpus, encoder, flat_path, batch_size, show_progress)
        return _save_ann(flat, faiss_type, index_path, meta, **(ann or {}))
    finally:
        if os.path.exists(flat_path):
            os.unlink(flat_path)


def build_from_flat_file(flat_path: str, save_dir: str, faiss_type: str, retrieval_method: str | None = None,
                         corpus_path: str | None = None, **ann) -> str:
    """Build an approximate index from an existing Flat index file (no re-encoding).

    The meta is the Flat file's (encoder, corpus fingerprint) with the new type, or, for a Flat file
    without one (FlashRAG's ``e5_Flat.index``), made from ``corpus_path`` and ``retrieval_method``.

    Raises:
        ValueError: ``flat_path`` is not a FAISS Flat file; neither a meta nor a corpus to describe it.
    """
    flat = open_flat_file(flat_path)
    if flat is None:
        raise ValueError(f"--from_flat {flat_path}: not a FAISS Flat index file")
    meta = IndexMeta.load(flat_path)
    method = retrieval_method or (meta.retrieval_method if meta else "custom")
    if corpus_path:
        spec = EncoderSpec.from_dict(meta.encoder) if meta and meta.encoder else resolve_encoder_spec(method)
        meta = _meta(method, load_corpus(corpus_path), corpus_path, encoder=spec, faiss_type=faiss_type,
                     dim=flat.dim)
    elif meta is None:
        raise ValueError(f"--from_flat {flat_path} has no meta JSON: pass --corpus_path (and "
                         f"--retrieval_method) to record which corpus and encoder it belongs to")
    meta.faiss_type = faiss_type
    os.makedirs(save_dir, exist_ok=True)
    index_path = os.path.join(save_dir, index_file_name(method, faiss_type))
    return _save_ann(flat, faiss_type, index_path, meta, **ann)


def _save_ann(flat, faiss_type: str, index_path: str, meta: IndexMeta, train_size: int | None = None,
              search_params: dict | None = None, recall_queries: int = 1000, device: str | None = None) -> str:
    """Build the approximate index from ``flat``, measure its recall, save index + meta."""
    import faiss

    index, stats = build_from_flat(flat, faiss_type, train_size, log=lambda m: print(m, file=sys.stderr))
    set_search_params(index, search_params, on_gpu=False)
    meta.search_params = search_params or None
    meta.extra = {**meta.extra, "build": {k: round(v, 3) for k, v in stats.items()}}
    if recall_queries:
        recall = measure_recall(index, flat, recall_queries, device=device or _default_device())
        meta.extra["recall"] = {**recall, "queries": "stored vectors", "against": "exact search"}
        print(f"recall@{recall['k']} against exact search: {recall['recall_at_k']:.4f} "
              f"({recall['num_queries']} stored vectors as queries)", file=sys.stderr)
    faiss.write_index(index, index_path)
    meta.save(index_path)
    return index_path


def build_bm25(corpus_path: str, save_dir: str) -> str:
    """Build, save and describe a BM25 index; returns the index directory (``save_dir/bm25``)."""
    corpus = load_corpus(corpus_path)
    retriever = BM25Retriever.build(corpus)
    index_dir = os.path.join(save_dir, "bm25")
    retriever.save(index_dir)
    _meta("bm25", corpus, corpus_path, bm25={"k1": retriever.model.k1, "b": retriever.model.b,
                                              "stemmer": retriever.stemmer_name,
                                              "stopwords": retriever.stopwords}).save(index_dir)
    return index_dir


def _meta(method: str, corpus: Corpus, corpus_path: str, encoder: EncoderSpec | None = None,
          **fields) -> IndexMeta:
    corpus_info = {"path": os.path.abspath(corpus_path), **corpus.fingerprint()}
    return IndexMeta(retrieval_method=method, corpus=corpus_info,
                     encoder=encoder.to_dict() if encoder else None, **fields)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--retrieval_method", required=True,
                        help="e5 | bge | minilm | bm25 | any HF encoder path or hub id")
    parser.add_argument("--model_path", default=None, help="encoder location overriding the preset's")
    parser.add_argument("--corpus_path", default=None, help="JSONL corpus of {id, contents}")
    parser.add_argument("--save_dir", required=True)
    parser.add_argument("--faiss_type", default="Flat", help="FAISS index-factory string")
    parser.add_argument("--pooling_method", choices=POOLING_METHODS, default=None,
                        help="default: the encoder family's convention")
    parser.add_argument("--max_length", type=int, default=None, help="tokens per passage")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--use_fp16", action="store_true", help="fp16 encoder (GPU)")
    parser.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    parser.add_argument("--from_flat", default=None,
                        help="build --faiss_type from this Flat index file's vectors instead of encoding")
    parser.add_argument("--train_size", type=int, default=None,
                        help="training vectors for IVF/PQ, sampled at random (default: 256 per IVF list)")
    parser.add_argument("--nprobe", type=int, default=None, help="IVF lists searched per query (meta)")
    parser.add_argument("--ef_search", type=int, default=None, help="HNSW search breadth (meta)")
    parser.add_argument("--recall_queries", type=int, default=1000,
                        help="stored vectors used as queries to measure recall@10 (0: skip)")
    args = parser.parse_args(argv)
    if args.from_flat is None and args.corpus_path is None:
        parser.error("--corpus_path is required unless --from_flat is given")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    params = {k: v for k, v in (("nprobe", args.nprobe), ("efSearch", args.ef_search)) if v is not None}
    ann = {"train_size": args.train_size, "search_params": params or None,
           "recall_queries": args.recall_queries, "device": args.device}
    if args.retrieval_method == "bm25":
        path = build_bm25(args.corpus_path, args.save_dir)
    elif args.from_flat:
        path = build_from_flat_file(args.from_flat, args.save_dir, args.faiss_type, args.retrieval_method,
                                    args.corpus_path, **ann)
    else:
        path = build_dense(args.corpus_path, args.save_dir, args.retrieval_method, args.model_path,
                           args.faiss_type, args.pooling_method, args.max_length, args.batch_size,
                           args.use_fp16, args.device, ann=ann)
    print(f"index written to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
