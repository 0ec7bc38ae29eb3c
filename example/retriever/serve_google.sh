#!/usr/bin/env bash
# Google Programmable Search (Custom Search JSON API), served with the /retrieve contract.
#   GOOGLE_API_KEY=... GOOGLE_CSE_ID=... bash example/retriever/serve_google.sh [--port 8000]
# Snippets only by default (Search-R1's --snippet_only); MODE=full_page fetches the linked pages.
# The API returns at most 10 results per call; SEARCH_URL points at a proxy.
set -euo pipefail
: "${GOOGLE_API_KEY:?set GOOGLE_API_KEY (https://developers.google.com/custom-search/v1/overview)}"
: "${GOOGLE_CSE_ID:?set GOOGLE_CSE_ID (the search engine id, cx)}"
url_flag=(); if [[ -n "${SEARCH_URL:-}" ]]; then url_flag=(--search_url "$SEARCH_URL"); fi
exec python -m search_r1.search.retrieval_server --retriever_name google \
  --search_mode "${MODE:-snippet_only}" --topk "${TOPK:-3}" "${url_flag[@]}" "$@"
