#!/usr/bin/env bash
# Device-side driver of benchmarks/learning_run.py (issue 33 part 2) on one H200, repo root: the whole
# run (install, warm start, evaluations, training) inside one hold of the machine.
# Here first: bash ../shared/device/wheels.sh --vllm; python benchmarks/learning_data.py --out data/learning
# Then device calls, back to back (the machine goes back after 30 s idle):
#   STAGE=copy bash benchmarks/device/learning_run.sh     # carrying .whl-big parts (<= 64 MiB a call) / data/learning
#   STAGE=start ARGS="--algo grpo --steps 100 --eval_steps 0,50,100" bash benchmarks/device/learning_run.sh
#                                                          # carrying .whl: install, warm start, the run detached
#   STAGE=poll WAIT_S=540 bash benchmarks/device/learning_run.sh   # repeat until it prints "learning run: done"
# /tmp/learning keeps data, index, warm start, checkpoints and results between calls; each poll's $OUT
# gets the run's log, its training metrics and its JSON once written.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 SEARCH_R1_CACHE=/tmp/learning/cache
out=${OUT:-benchmarks/results}
work=/tmp/learning
mkdir -p "$out" /tmp/parts "$work/results"
export PYTHONPATH=/tmp/site:$PWD
report() {
  cp "$work"/results/learning_*.json "$work"/results/learning_*.png "$out/" 2>/dev/null
  for f in "$work"/*/logs/metrics.jsonl; do [ -f "$f" ] && gzip -c "$f" > "$out/metrics_$(basename "$(dirname "$(dirname "$f")")").jsonl.gz"; done
  [ -f "$work/run.log" ] && tail -c 2000000 "$work/run.log" > "$out/run.log.txt"
  grep -E "learning run:|evaluate step|^train |Traceback|Error" "$work/run.log" 2>/dev/null | tail -n 20
}
case "${STAGE:-poll}" in
  copy)
    cp .whl-big/* /tmp/parts/ 2>/dev/null
    [ -d data/learning ] && mkdir -p "$work/data" && cp -r data/learning/* "$work/data/"
    ls /tmp/parts "$work/data" 2>/dev/null | tr '\n' ' '; echo
    ;;
  start)
    mkdir -p .whl-big && cp /tmp/parts/* .whl-big/
    started=$(date +%s)
    [ -d /tmp/site/vllm ] || bash .whl/install.sh >/dev/null || exit 1
    echo "install: $(( $(date +%s) - started )) s"
    started=$(date +%s)
    timeout -k 10 "${TIMEOUT_S:-400}" python3 scripts/warm_start.py || exit 1
    echo "warm start: $(( $(date +%s) - started )) s"
    # the run outlives this call: setsid keeps it out of the call's process group
    setsid nohup python3 benchmarks/learning_run.py --work_dir "$work" --out_dir "$work/results" \
      --budget_s "${BUDGET_S:-1300}" ${ARGS:-} > "$work/run.log" 2>&1 < /dev/null &
    echo "learning run started (pid $!)"
    ;;
  poll)
    waited=0
    while [ "$waited" -lt "${WAIT_S:-540}" ] && ! grep -q "learning run:" "$work/run.log" 2>/dev/null; do
      sleep 10; waited=$((waited + 10))
    done
    report
    ;;
esac
