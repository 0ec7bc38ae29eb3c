#!/usr/bin/env bash
# Device-side driver of benchmarks/learning_run.py (issue 33 part 2) on one H200, repo root: the whole
# run (install, warm start, evaluations, training) inside one hold of the machine.
# Here first: bash ../shared/device/wheels.sh --vllm; python benchmarks/learning_data.py --out data/learning
# Then device calls, back to back (the machine goes back after 30 s idle):
#   STAGE=copy bash benchmarks/device/learning_run.sh     # carrying .whl-big parts (<= 64 MiB a call with the tree) /
#                                                          # data/learning / .cache/device-compile (an earlier run's
#                                                          # compile cache); ten calls: ray part01 + the cache; ray
#                                                          # part00; data/learning + vllm part05; smollm2 part00;
#                                                          # smollm2 part01; vllm part00 .. part04
#   STAGE=start DEVICE_LEFT_S=<status's budget_left_s> ARGS="--algo grpo --steps 100 --eval_steps 0,50,100" \
#     bash benchmarks/device/learning_run.sh              # carrying .whl: install, warm start, the run detached;
#                                                          # the run's budget: DEVICE_LEFT_S less this call's time
#                                                          # less END_MARGIN_S (250: the last poll's overhead), or BUDGET_S
#   STAGE=poll WAIT_S=540 bash benchmarks/device/learning_run.sh   # repeat until it prints "learning run: done"
#   STAGE=stop bash benchmarks/device/learning_run.sh      # ends a run early (its trainer, Ray, the engine) and
#                                                          # reports; a STAGE=start with other ARGS may follow.
#                                                          # Never `pkill -f learning_run.py` in a call's command:
#                                                          # it matches that call's own shell and ends the hold
#                                                          # (WAIT_S >= 20 s under the call's limit: a call cut at
#                                                          # its limit brings nothing back)
# /tmp/learning keeps data, index, warm start, checkpoints and results between calls; each poll's $OUT
# gets the run's log, its training metrics and its JSON once written, and with SEND_COMPILE_CACHE=1, once
# after the first training step, the compile caches as compile_cache.tgz.part* (keep them in
# .cache/device-compile/ here and carry them on the next machine of the session: the first step's
# torch.compile then comes from the cache, ~115 s -> ~75 s).
set -uo pipefail
work=/tmp/learning
source benchmarks/device/common.sh
mkdir -p "$work/results"
report() {  # files come back only when named in letters, digits, '.', '_' and '-': a run's '+' becomes '_'
  local f name
  for f in "$work"/results/learning_*.json "$work"/results/learning_*.png; do
    [ -f "$f" ] && name=$(basename "$f") && cp "$f" "$out/${name//+/_}"
  done
  for f in "$work"/*/logs/metrics.jsonl; do
    [ -f "$f" ] && name=$(basename "$(dirname "$(dirname "$f")")") && gzip -c "$f" > "$out/metrics_${name//+/_}.jsonl.gz"
  done
  # the trainer's per-question validation dumps as they come: a hold that ends before the run writes
  # its JSON still brings back every evaluation done so far (learning_run.py adopts them from val/)
  for f in "$work"/*/val; do
    [ -d "$f" ] && name=$(basename "$(dirname "$f")") && tar -cz -C "$(dirname "$f")" val > "$out/val_${name//+/_}.tgz"
  done
  [ -f "$work/run.log" ] && tail -c 2000000 "$work/run.log" > "$out/run.log.txt"
  grep -E "learning run:|evaluate step|^train |Traceback|Error" "$work/run.log" 2>/dev/null | tail -n 20
}
case "${STAGE:-poll}" in
  copy) copy_carried ;;
  start)
    call_started=$(date +%s)
    install_wheels || exit 1
    unpack_compile_cache
    started=$(date +%s)
    # WARM_START_ARGS="--multi_hop_searches 2" with ARGS="... --warm_start_searches 2"
    timeout -k 10 "${TIMEOUT_S:-400}" python3 scripts/warm_start.py ${WARM_START_ARGS:-} || exit 1
    echo "warm start: $(( $(date +%s) - started )) s"
    budget=${BUDGET_S:-1300}
    if [ -n "${DEVICE_LEFT_S:-}" ]; then  # what the session's device budget leaves the run, its end seen by a poll
      budget=$(( DEVICE_LEFT_S - ($(date +%s) - call_started) - ${END_MARGIN_S:-250} ))
    fi
    echo "run budget: $budget s"
    # the run outlives this call: setsid keeps it out of the call's process group
    run_from_snapshot
    setsid nohup python3 benchmarks/learning_run.py --work_dir "$work" --out_dir "$work/results" \
      --budget_s "$budget" ${ARGS:-} > "$work/run.log" 2>&1 < /dev/null &
    echo "learning run started (pid $!)"
    ;;
  stop)
    # patterns that match the run's processes, not this call's shell (its command names only this script)
    pkill -TERM -f "learning_run.py --work_dir"; pkill -TERM -f "verl.trainer.main_ppo"
    sleep 15
    ray stop --force > /dev/null 2>&1
    pkill -KILL -f "verl.trainer.main_ppo|EngineCore|retrieval_server"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    report
    ;;
  poll)
    wait_for_line "learning run:"
    report
    send_compile_cache
    ;;
esac
