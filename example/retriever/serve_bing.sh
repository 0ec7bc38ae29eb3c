#!/usr/bin/env bash
# Bing Web Search API v7, served with the /retrieve contract.
#   BING_API_KEY=... bash example/retriever/serve_bing.sh [--port 8000]
# (Microsoft retired the public Bing Search APIs in August 2025; SEARCH_URL points at any endpoint
# that speaks v7, e.g. a proxy.)
set -euo pipefail
: "${BING_API_KEY:?set BING_API_KEY (Ocp-Apim-Subscription-Key)}"
url_flag=(); if [[ -n "${SEARCH_URL:-}" ]]; then url_flag=(--search_url "$SEARCH_URL"); fi
exec python -m search_r1.search.retrieval_server --retriever_name bing \
  --search_mode "${MODE:-snippet_only}" --topk "${TOPK:-3}" "${url_flag[@]}" "$@"
