#!/usr/bin/env bash
# Search-R1's quickstart, step 1: the e5 wiki-18 index (joined into e5_Flat.index) and the wiki-18
# corpus (decompressed into wiki-18.jsonl) from the Hugging Face hub.
#   bash scripts/download.sh /data/wiki18            # or SAVE_PATH=/data/wiki18 bash scripts/download.sh
# Extra flags go to scripts/download.py (--repo_id, --keep_parts, --skip_corpus, ...).
set -euo pipefail
save_path=${SAVE_PATH:-}
if [[ -z "$save_path" && $# -gt 0 && "$1" != --* ]]; then save_path=$1; shift; fi
: "${save_path:?give the target folder: bash scripts/download.sh DIR (or SAVE_PATH=DIR)}"
exec python "$(dirname "$0")/download.py" --save_path "$save_path" "$@"
