#!/usr/bin/env bash
# Online search through serper.dev (Google results), served with the /retrieve contract.
#   SERPER_API_KEY=... bash example/retriever/serve_serper.sh [--port 8000]
# MODE=full_page also fetches the linked pages (8 at a time, 5 s each); SEARCH_URL points at a proxy.
set -euo pipefail
: "${SERPER_API_KEY:?set SERPER_API_KEY}"
url_flag=(); if [[ -n "${SEARCH_URL:-}" ]]; then url_flag=(--search_url "$SEARCH_URL"); fi
exec python -m search_r1.search.retrieval_server --retriever_name serper \
  --search_mode "${MODE:-snippet_only}" --topk "${TOPK:-3}" "${url_flag[@]}" "$@"
