#!/usr/bin/env bash
# Index a corpus for the retrieval server (Search-R1's build_index.sh, calling this project's
# index_builder). Edit the variables below, or set them in the environment:
#   CORPUS_FILE=my_corpus.jsonl SAVE_DIR=indexes RETRIEVER_NAME=bm25 bash search_r1/search/build_index.sh
# The corpus is JSONL, one {"id", "contents"} per line, contents '"Title"\ntext' (docs/quickstart.md).
# Dense output: $SAVE_DIR/${RETRIEVER_NAME}_${FAISS_TYPE}.index (+ .meta.json); BM25: $SAVE_DIR/bm25/.
set -euo pipefail

corpus_file=${CORPUS_FILE:-/your/corpus/jsonl/file}   # jsonl
save_dir=${SAVE_DIR:-/the/path/to/save/index}
retriever_name=${RETRIEVER_NAME:-e5}                   # e5 | bge | minilm | bm25 | a model path
retriever_model=${RETRIEVER_MODEL:-intfloat/e5-base-v2}  # ignored for bm25; "" = the preset's model
faiss_type=${FAISS_TYPE:-Flat}                         # Flat, HNSW64, IVF4096,PQ64 ... (FAISS factory)
max_length=${MAX_LENGTH:-256}
batch_size=${BATCH_SIZE:-512}                          # 512 suits a GPU; 32 on CPU
pooling_method=${POOLING_METHOD:-mean}

if [[ ! -f "$corpus_file" ]]; then
  echo "build_index.sh: corpus not found: $corpus_file (set CORPUS_FILE or edit this script)" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"   # runs from a clone without pip install too
if [[ "$retriever_name" == "bm25" ]]; then
  exec python -m search_r1.search.index_builder --retrieval_method bm25 \
    --corpus_path "$corpus_file" --save_dir "$save_dir"
fi
device_flags=()
if command -v nvidia-smi >/dev/null 2>&1; then device_flags=(--use_fp16); else device_flags=(--device cpu); fi
model_flag=()
if [[ -n "$retriever_model" ]]; then model_flag=(--model_path "$retriever_model"); fi
exec python -m search_r1.search.index_builder --retrieval_method "$retriever_name" \
  "${model_flag[@]}" \
  --corpus_path "$corpus_file" \
  --save_dir "$save_dir" \
  --max_length "$max_length" \
  --batch_size "$batch_size" \
  --pooling_method "$pooling_method" \
  --faiss_type "$faiss_type" \
  "${device_flags[@]}"
