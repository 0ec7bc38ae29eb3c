#!/usr/bin/env bash
# Online search through serper.dev (Google) with the same /retrieve contract.
# MODE=full_page also fetches the linked pages (8 at a time, 5 s each).
set -euo pipefail
: "${SERPER_API_KEY:?set SERPER_API_KEY}"
exec python -m search_r1.search.retrieval_server --retriever_name serper \
  --search_mode "${MODE:-snippet_only}" --topk "${TOPK:-3}" "$@"
