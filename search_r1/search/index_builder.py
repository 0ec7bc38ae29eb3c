"""Build a dense FAISS or BM25 index over a JSONL corpus (CLI compatible with Search-R1's builder).

    python -m search_r1.search.index_builder --retrieval_method minilm \
        --corpus_path example/corpus.jsonl --save_dir indexes/ --faiss_type Flat

writes ``indexes/minilm_Flat.index`` plus ``indexes/minilm_Flat.index.meta.json``; with
``--retrieval_method bm25`` it writes the directory ``indexes/bm25/``. Dense vectors are added to
FAISS chunk by chunk, so only one chunk of embeddings is in memory unless the index type needs
training (IVF, PQ), which, as in FlashRAG, trains on all embeddings.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from .bm25 import BM25Retriever
from .corpus import Corpus, load_corpus
from .encoders import POOLING_METHODS, Encoder, EncoderSpec, resolve_encoder_spec
from .index_meta import IndexMeta

CHUNK_PASSAGES = 8192  # passages encoded before being handed to FAISS


def index_file_name(retrieval_method: str, faiss_type: str) -> str:
    """FlashRAG's naming: ``{method}_{faiss_type}.index`` (``e5_Flat.index``)."""
    method = os.path.basename(os.path.normpath(retrieval_method))
    return f"{method}_{faiss_type.replace(',', '_')}.index"


def build_dense_index(corpus: Corpus, encoder: Encoder, faiss_type: str = "Flat",
                      batch_size: int = 64, show_progress: bool = True):
    """Encode every passage and return a FAISS inner-product index (row i = corpus row i)."""
    import faiss
    from tqdm import tqdm

    index = faiss.index_factory(encoder.dim, faiss_type, faiss.METRIC_INNER_PRODUCT)
    bar = tqdm(total=len(corpus), desc="encoding passages", unit="psg", disable=not show_progress)
    held = []
    for texts in corpus.iter_contents(CHUNK_PASSAGES):
        vectors = encoder.encode(texts, is_query=False, batch_size=batch_size, progress=bar)
        if index.is_trained:
            index.add(vectors)
        else:
            held.append(vectors)
    bar.close()
    if held:
        vectors = np.concatenate(held)
        index.train(vectors)
        index.add(vectors)
    return index


def build_dense(corpus_path: str, save_dir: str, retrieval_method: str, model_path: str | None = None,
                faiss_type: str = "Flat", pooling_method: str | None = None, max_length: int | None = None,
                batch_size: int = 64, use_fp16: bool = False, device: str | None = None,
                show_progress: bool = True) -> str:
    """Build, save and describe a dense index; returns the index file path."""
    import faiss

    corpus = load_corpus(corpus_path)
    spec = resolve_encoder_spec(retrieval_method, model_path, pooling_method, max_length)
    encoder = Encoder(spec, device=device or _default_device(), use_fp16=use_fp16)
    index = build_dense_index(corpus, encoder, faiss_type, batch_size, show_progress)
    os.makedirs(save_dir, exist_ok=True)
    index_path = os.path.join(save_dir, index_file_name(retrieval_method, faiss_type))
    faiss.write_index(index, index_path)
    _meta(retrieval_method, corpus, corpus_path, faiss_type=faiss_type, dim=encoder.dim,
          encoder=spec).save(index_path)
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
    parser.add_argument("--corpus_path", required=True, help="JSONL corpus of {id, contents}")
    parser.add_argument("--save_dir", required=True)
    parser.add_argument("--faiss_type", default="Flat", help="FAISS index-factory string")
    parser.add_argument("--pooling_method", choices=POOLING_METHODS, default=None,
                        help="default: the encoder family's convention")
    parser.add_argument("--max_length", type=int, default=None, help="tokens per passage")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--use_fp16", action="store_true", help="fp16 encoder (GPU)")
    parser.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.retrieval_method == "bm25":
        path = build_bm25(args.corpus_path, args.save_dir)
    else:
        path = build_dense(args.corpus_path, args.save_dir, args.retrieval_method, args.model_path,
                           args.faiss_type, args.pooling_method, args.max_length, args.batch_size,
                           args.use_fp16, args.device)
    print(f"index written to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
