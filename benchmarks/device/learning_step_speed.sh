#!/usr/bin/env bash
# Device-side driver of benchmarks/learning_step_speed.py (issue 33 part 1) on one H200, repo root.
# Here first: bash ../shared/device/wheels.sh --vllm (+ the py-spy wheel in .whl for PYSPY_S),
# python benchmarks/learning_data.py --out data/learning, and the baseline tree:
#   mkdir -p .bench/trees/d511d1f && git archive d511d1f | tar -x -C .bench/trees/d511d1f
# Then device calls, back to back (the machine goes back after 30 s idle):
#   STAGE=copy bash benchmarks/device/learning_step_speed.sh      # carrying .whl-big parts (one call each) / data/learning
#   STAGE=prepare bash benchmarks/device/learning_step_speed.sh   # carrying .whl: install, warm start
#   STAGE=run VARIANTS=before bash benchmarks/device/learning_step_speed.sh   # carrying .bench; one variant per call
# /tmp/step_speed keeps data, index, warm start and the merged report between calls; each call's $OUT
# gets the report so far (+ py-spy stacks with PYSPY_S=seconds).
set -uo pipefail
work=/tmp/step_speed
source benchmarks/device/common.sh
case "${STAGE:-run}" in
  copy) copy_carried ;;
  prepare)
    install_wheels || exit 1
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
    started=$(date +%s)
    timeout -k 10 "${TIMEOUT_S:-500}" python3 scripts/warm_start.py || exit 1
    echo "warm start: $(( $(date +%s) - started )) s"
    ;;
  run)
    timeout -k 10 "${TIMEOUT_S:-570}" python3 benchmarks/learning_step_speed.py --work_dir "$work" --out_dir "$out" \
        --data "$work/data" --variants "${VARIANTS:-before}" --steps "${STEPS:-6}" --pyspy_s "${PYSPY_S:-0}" \
        --timeout_s "${VARIANT_TIMEOUT_S:-480}" ${ARGS:-}
    echo "learning_step_speed exit: $?"
    tail -n 30 "$work"/*.log | cut -c1-400 | tail -n 60
    ;;
esac
