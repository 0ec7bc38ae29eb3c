#!/usr/bin/env bash
# SerpApi (Google, Bing, ... results; ENGINE picks the engine), served with the /retrieve contract.
#   SERPAPI_API_KEY=... ENGINE=google bash example/retriever/serve_serpapi.sh [--port 8000]
set -euo pipefail
: "${SERPAPI_API_KEY:?set SERPAPI_API_KEY (https://serpapi.com/)}"
url_flag=(); if [[ -n "${SEARCH_URL:-}" ]]; then url_flag=(--search_url "$SEARCH_URL"); fi
exec python -m search_r1.search.retrieval_server --retriever_name serpapi --serp_engine "${ENGINE:-google}" \
  --search_mode "${MODE:-snippet_only}" --topk "${TOPK:-3}" "${url_flag[@]}" "$@"
