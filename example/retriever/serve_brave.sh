#!/usr/bin/env bash
# Brave Search API (web search), served with the /retrieve contract.
#   BRAVE_API_KEY=... bash example/retriever/serve_brave.sh [--port 8000]
# The API returns at most 20 results per call; the free plan allows 1 request/s: WEB_RPS=1.
set -euo pipefail
: "${BRAVE_API_KEY:?set BRAVE_API_KEY (X-Subscription-Token)}"
url_flag=(); if [[ -n "${SEARCH_URL:-}" ]]; then url_flag=(--search_url "$SEARCH_URL"); fi
exec python -m search_r1.search.retrieval_server --retriever_name brave --web_rps "${WEB_RPS:-0}" \
  --search_mode "${MODE:-snippet_only}" --topk "${TOPK:-3}" "${url_flag[@]}" "$@"
