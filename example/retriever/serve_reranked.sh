#!/usr/bin/env bash
# A cross-encoder behind a first-stage retriever (Search-R1's retrieval_launch_hierarchical.sh):
# the first stage returns RETRIEVAL_TOPK (10) candidates per query, the reranker keeps the
# RERANKING_TOPK (3) best. The first stage is what retrieval_launch.sh starts (same variables:
# FILE_PATH, INDEX, CORPUS, RETRIEVER, RETRIEVER_MODEL, FAISS_GPU; default Search-R1's e5 wiki-18).
# RERANKER: any sequence-classification model folder or hub id (Search-R1's is
# cross-encoder/ms-marco-MiniLM-L12-v2, on a machine with hub access). Without RERANKER, the project's
# own, fine-tuned offline from the shipped MiniLM by scripts/build_reranker.py on the shared data, or
# on the repo's example/ data when there are none (built once, minutes on CPU, then cached; it says
# which data it used):
#   INDEX=indexes/bm25 CORPUS=example/corpus.jsonl RETRIEVER=bm25 bash example/retriever/serve_reranked.sh
# A web backend with a reranker: bash example/retriever/serve_google.sh --reranker_model "$RERANKER"
set -euo pipefail
here=$(dirname "$0")
if [[ -z "${RERANKER:-}" ]]; then
  echo "serve_reranked.sh: no RERANKER given: the project's cross-encoder (scripts/build_reranker.py)" >&2
  RERANKER=$("${PYTHON:-python}" "$here/../../scripts/build_reranker.py")
fi
exec "$here/../../retrieval_launch.sh" \
  --reranker_model "$RERANKER" \
  --retrieval_topk "${RETRIEVAL_TOPK:-10}" \
  --reranking_topk "${RERANKING_TOPK:-3}" \
  --reranker_batch_size "${RERANKER_BATCH_SIZE:-32}" "$@"
