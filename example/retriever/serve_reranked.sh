#!/usr/bin/env bash
# A cross-encoder behind a first-stage retriever (Search-R1's retrieval_launch_hierarchical.sh):
# the first stage returns RETRIEVAL_TOPK (10) candidates per query, the reranker keeps the
# RERANKING_TOPK (3) best. The first stage is what retrieval_launch.sh starts (same variables:
# FILE_PATH, INDEX, CORPUS, RETRIEVER, RETRIEVER_MODEL, FAISS_GPU; default Search-R1's e5 wiki-18).
# RERANKER: any sequence-classification model (default Search-R1's cross-encoder/ms-marco-MiniLM-L12-v2);
# offline, the one built from the shipped MiniLM: RERANKER=$(python scripts/build_reranker.py | tail -1)
#   INDEX=indexes/bm25 CORPUS=example/corpus.jsonl RETRIEVER=bm25 RERANKER=... bash example/retriever/serve_reranked.sh
# A web backend with a reranker: bash example/retriever/serve_google.sh --reranker_model "$RERANKER"
set -euo pipefail
here=$(dirname "$0")
exec "$here/../../retrieval_launch.sh" \
  --reranker_model "${RERANKER:-cross-encoder/ms-marco-MiniLM-L12-v2}" \
  --retrieval_topk "${RETRIEVAL_TOPK:-10}" \
  --reranking_topk "${RERANKING_TOPK:-3}" \
  --reranker_batch_size "${RERANKER_BATCH_SIZE:-32}" "$@"
