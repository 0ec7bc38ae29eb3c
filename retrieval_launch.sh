#!/usr/bin/env bash
# Start the retrieval server (flags as in Search-R1's retrieval_launch.sh).
# Defaults: the e5 wiki-18 index of Search-R1 under FILE_PATH; override with environment variables, e.g.
# the BM25 index that train_*.sh build over the bundled example corpus:
#   INDEX=data/example_search/corpus.bm25/bm25 CORPUS=example/corpus.jsonl RETRIEVER=bm25 ./retrieval_launch.sh
# (build others with: python -m search_r1.search.index_builder --retrieval_method minilm|e5|bm25 ...)
# Extra arguments are passed through (e.g. --port 8001 --host 0.0.0.0 --no_batching).
set -euo pipefail
PYTHON=${PYTHON:-python}
source "$(dirname "$0")/scripts/require_python.sh"

file_path=${FILE_PATH:-/the/path/you/save/corpus}
index_file=${INDEX:-$file_path/e5_Flat.index}
corpus_file=${CORPUS:-$file_path/wiki-18.jsonl}
retriever_name=${RETRIEVER:-e5}
retriever_path=${RETRIEVER_MODEL:-}
topk=${TOPK:-3}

search_module=faiss
[[ "$retriever_name" == "bm25" ]] && search_module=bm25s
require_python_modules retrieval_launch.sh fastapi uvicorn numpy "$search_module"
if [[ ! -e "$index_file" ]]; then
  echo "retrieval_launch.sh: no index at $index_file (set INDEX, CORPUS and RETRIEVER, or FILE_PATH for" \
       "Search-R1's e5_Flat.index + wiki-18.jsonl; see the comment at the top of this script)" >&2
  exit 2
fi
gpu_flag=()
if [[ "${FAISS_GPU:-auto}" == "1" ]] || { [[ "${FAISS_GPU:-auto}" == "auto" ]] && command -v nvidia-smi >/dev/null 2>&1; }; then
  gpu_flag=(--faiss_gpu)
fi
model_flag=()
if [[ -n "$retriever_path" ]]; then model_flag=(--retriever_model "$retriever_path"); fi

exec "$PYTHON" -m search_r1.search.retrieval_server --index_path "$index_file" \
  --corpus_path "$corpus_file" \
  --topk "$topk" \
  --retriever_name "$retriever_name" \
  "${model_flag[@]}" "${gpu_flag[@]}" "$@"
