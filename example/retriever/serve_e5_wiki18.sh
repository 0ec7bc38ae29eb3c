#!/usr/bin/env bash
# Search-R1's setup: the e5-base-v2 Flat index of wiki-18 (e5_Flat.index + wiki-18.jsonl, as
# downloaded by Search-R1's scripts/download.py), index sharded over all GPUs in fp16.
set -euo pipefail
file_path=${FILE_PATH:?set FILE_PATH to the folder holding e5_Flat.index and wiki-18.jsonl}
FILE_PATH="$file_path" RETRIEVER=e5 RETRIEVER_MODEL=${RETRIEVER_MODEL:-intfloat/e5-base-v2} FAISS_GPU=1 \
  exec ./retrieval_launch.sh "$@"
