#!/usr/bin/env bash
# Build a BM25 (bm25s) index of example/corpus.jsonl (seconds) and serve it on 127.0.0.1:8000.
set -euo pipefail
corpus=${CORPUS:-example/corpus.jsonl}
save_dir=${SAVE_DIR:-indexes}
if [[ ! -f "$save_dir/bm25/search_r1_meta.json" ]]; then
  python -m search_r1.search.index_builder --retrieval_method bm25 --corpus_path "$corpus" --save_dir "$save_dir"
fi
INDEX="$save_dir/bm25" CORPUS="$corpus" RETRIEVER=bm25 FAISS_GPU=0 exec ./retrieval_launch.sh "$@"
