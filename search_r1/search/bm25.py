"""BM25 retrieval with ``bm25s`` (sparse scores precomputed at index time; saved and reloadable).

Search-R1 used Pyserini/Lucene BM25 (Porter stemming, English stopwords, k1=0.9, b=0.4). We keep
those parameters and an English Snowball stemmer (PyStemmer, a pinned requirement); bm25s needs no
JVM. The same tokenizer settings are stored with the index so queries are tokenised as passages were.
"""

from __future__ import annotations

import json
import os
import time
from typing import Sequence

import numpy as np

from .corpus import Corpus
from .dense import hits_from_arrays

# bm25s imports jax when it is installed and runs a top-k at import time; on a GPU machine that
# initialises XLA's GPU client, which preallocates 75% of the GPU's memory for a CPU-side index and
# leaves the trainer out of memory (docs/benchmarks.md, GPU pipeline). Top-k over BM25 scores is
# cheap on the CPU; keep jax there.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

TOKENIZER_FILE = "search_r1_bm25_tokenizer.json"
DEFAULT_K1, DEFAULT_B = 0.9, 0.4  # Pyserini's BM25 defaults, which Search-R1's bm25 server used


def _stemmer(name: str | None):
    """The PyStemmer stemmer ``name`` (None for no stemming).

    Raises:
        ImportError: a stemmer is named but PyStemmer is missing. Falling back to no stemming would
            tokenise queries differently from the indexed passages and silently ruin retrieval.
    """
    if not name:
        return None
    try:
        import Stemmer
    except ImportError as err:
        raise ImportError(f"BM25 stemmer {name!r} needs PyStemmer (pip install PyStemmer); "
                          "build with stemmer=None for an unstemmed index") from err
    return Stemmer.Stemmer(name)


class BM25Retriever:
    """A bm25s index paired with its corpus.

    Args:
        model: a fitted ``bm25s.BM25``.
        corpus: the passages in index row order.
        stemmer: Snowball language name used at index time (or None).
        stopwords: bm25s stopword list name.
    """

    kind = "bm25"

    def __init__(self, model, corpus: Corpus, stemmer: str | None = "english", stopwords: str = "en"):
        num_docs = int(model.scores["num_docs"])
        if num_docs != len(corpus):
            raise ValueError(f"BM25 index has {num_docs} documents but corpus {corpus.path} has {len(corpus)} rows")
        self.model = model
        self.corpus = corpus
        self.stemmer_name = stemmer
        self.stopwords = stopwords
        self._stemmer = _stemmer(stemmer)

    @classmethod
    def build(cls, corpus: Corpus, k1: float = DEFAULT_K1, b: float = DEFAULT_B,
              stemmer: str | None = "english", stopwords: str = "en") -> "BM25Retriever":
        """Tokenise and index every passage (progress bars from bm25s)."""
        import bm25s

        stem = _stemmer(stemmer)
        tokens = bm25s.tokenize(corpus.contents.to_pylist(), stopwords=stopwords, stemmer=stem)
        model = bm25s.BM25(k1=k1, b=b)
        model.index(tokens)
        return cls(model, corpus, stemmer, stopwords)

    def save(self, save_dir: str) -> None:
        """Write the bm25s arrays plus our tokenizer settings into ``save_dir``."""
        os.makedirs(save_dir, exist_ok=True)
        self.model.save(save_dir)
        with open(os.path.join(save_dir, TOKENIZER_FILE), "w") as handle:
            json.dump({"stemmer": self.stemmer_name, "stopwords": self.stopwords}, handle)

    @classmethod
    def load(cls, index_dir: str, corpus: Corpus) -> "BM25Retriever":
        """Load a saved index; a bm25s index without our settings file assumes the defaults.

        Raises:
            FileNotFoundError: ``index_dir`` is not a bm25s index directory.
        """
        import bm25s

        if not os.path.isfile(os.path.join(index_dir, "params.index.json")):
            raise FileNotFoundError(f"{index_dir} is not a bm25s index directory (no params.index.json)")
        settings = {"stemmer": "english", "stopwords": "en"}
        settings_path = os.path.join(index_dir, TOKENIZER_FILE)
        if os.path.isfile(settings_path):
            with open(settings_path) as handle:
                settings.update(json.load(handle))
        model = bm25s.BM25.load(index_dir, mmap=False)
        return cls(model, corpus, settings["stemmer"], settings["stopwords"])

    def __len__(self) -> int:
        return len(self.corpus)

    def describe(self) -> dict:
        return {"kind": self.kind, "encoder": None, "index_size": len(self),
                "k1": self.model.k1, "b": self.model.b, "stemmer": self.stemmer_name}

    def search(self, queries: Sequence[str], topk: int, timings: dict | None = None) -> list[list[dict]]:
        """Up to ``topk`` passages per query, ``{"document", "score"}`` in descending BM25 score.

        Only passages that share a term with the query are returned (score > 0): bm25s fills its
        ``k`` slots with score-0 passages when fewer match, and those are noise to the policy. A
        query with no indexed term (empty, stopwords only, unknown words) gets an empty list, which
        the rollout renders as an empty search.
        """
        import bm25s

        start = time.perf_counter()
        tokens = bm25s.tokenize(list(queries), stopwords=self.stopwords, stemmer=self._stemmer,
                                return_ids=False, show_progress=False)
        ids, scores = self.model.retrieve(tokens, k=min(topk, len(self)), show_progress=False,
                                          n_threads=1, backend_selection="numpy")
        searched = time.perf_counter()
        scores = np.asarray(scores)
        matched = np.where(scores > 0, np.asarray(ids), -1)  # ids < 0 are dropped below
        results = hits_from_arrays(self.corpus, matched, scores)
        if timings is not None:
            timings["search_s"] = timings.get("search_s", 0.0) + searched - start
        return results
