#!/usr/bin/env bash
# Issue 28, part 1: train_grpo.sh and train_ppo.sh at the paper's lengths on ONE H200, for a random-init
# Qwen2.5 shape biased to search (benchmarks/paper_scale_prep.py: turns close with </search> after ~150
# tokens, prompts end with a forced "<search>"), against a real retriever server on the same machine.
# Per run: metrics.jsonl (timing_s/*, perf/max_memory_*_gb/<phase>, perf/throughput_tokens_per_s,
# perf/mfu/actor, context_length/max) in $OUT/paper_train/<shape>/<algo> (with GPUS > 1:
# $OUT/paper_train/<shape>/<GPUS>gpu/<algo>); a summary $OUT/paper_scale_train_<shape>[_<GPUS>gpu].json, and
# the runs added under "train" to $OUT/paper_scale.json (with GPUS > 1 also "scaling" against the 1-GPU runs).
# On the device use benchmarks/device/paper_scale.sh (stages, detached); by hand, repo root, /tmp/site
# holding .whl plus vLLM (bash ../shared/device/wheels.sh --vllm):
#   STEPS=4 ALGOS=grpo,ppo SHAPE=qwen2.5-3b RETRIEVER=bm25 bash benchmarks/paper_scale_train.sh
# Env: SHAPE (qwen2.5-3b | qwen2.5-1.5b), STEPS (4: step 1 compiles, the median is of the rest), ALGOS
# (grpo,ppo), BATCH (prompts per GPU: 64 = the paper's 512 over 8 GPUs; 512 = the whole paper batch on one
# GPU, ~8x longer), GPUS (1: ranks of one node, one GPU each; the step's batch is BATCH x GPUS, so a run
# on 2 GPUs does each GPU's work of the 1-GPU run: weak scaling), MAX_TURNS (4; the paper uses 2-4),
# RUN_TIMEOUT (1200 s per run), RETRIEVER (bm25: BM25 over example/corpus.jsonl, built here; scale: the
# part-1 retriever, 10M synthetic e5 Flat vectors in fp16 on the same GPU, from benchmarks/device/retriever_scale.sh's /tmp/scale), GPU_MEM_UTIL (0.35: vLLM's
# share; the scale retriever holds ~18 GB), MAX_MODEL_LEN, EXTRA (more overrides), VARIANT (a name for EXTRA: the
# runs become <algo>_<VARIANT>, beside the plain ones in the report), MODEL + DATA (another
# policy and data folder, e.g. the real SmolLM2 with its chat-template data:
# MODEL=$(python3 -c 'from verl.utils.model_zoo import smollm2_dir; print(smollm2_dir())') DATA=/tmp/paper_data_src).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHON=python3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0
out=${OUT:-benchmarks/results}
steps=${STEPS:-4}
gpus=${GPUS:-1}
batch=$(( ${BATCH:-64} * gpus ))
shape=${SHAPE:-qwen2.5-3b}
runs="$out/paper_train/$shape" summary="$out/paper_scale_train_$shape.json"
if [ "$gpus" -gt 1 ]; then runs+="/${gpus}gpu" summary="${summary%.json}_${gpus}gpu.json"; fi
mkdir -p "$runs"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
# 1. Model and data (kept in /tmp between calls on a warm machine).
model=${MODEL:-/tmp/$shape-search}
data=${DATA:-/tmp/paper_data}
if [ ! -f /tmp/paper_data/train.parquet ] || [ ! -f /tmp/paper_data_src/train.parquet ]; then
  python3 -c "from pathlib import Path; import scripts.quickstart as q; q.ensure_data(Path('/tmp/paper_data_src'), Path('example/qa'))" || exit 1
  python3 benchmarks/paper_scale_prep.py data --src /tmp/paper_data_src --out /tmp/paper_data || exit 1
fi
# the bias is calibrated in the turns that follow the data's own prompts (the forced prefix at their end)
if [ -z "${MODEL:-}" ] && [ ! -f "$model/search_bias.json" ]; then
  tok=$(python3 -c 'from verl.utils.model_zoo import smollm2_dir; print(smollm2_dir())' | tail -1)
  python3 benchmarks/save_random_model.py --shape "$shape" --tokenizer "$tok" --out "/tmp/$shape-random" || exit 1
  python3 benchmarks/paper_scale_prep.py model --src "/tmp/$shape-random" --out "$model" \
    --data /tmp/paper_data/train.parquet || exit 1
  rm -rf "/tmp/$shape-random"
fi
# 2. The retriever server on port 8000 (one already answering there is used as it is).
retriever_pid=""
if ! curl -sf http://127.0.0.1:8000/health > /dev/null; then
  if [ "${RETRIEVER:-bm25}" = scale ]; then  # the part-1 retriever: torch-sharded fp16 Flat on this GPU
    [ -f /tmp/scale/synthetic_Flat.index ] || { echo "no /tmp/scale: run benchmarks/device/retriever_scale.sh first"; exit 1; }
    server=(--index_path /tmp/scale/synthetic_Flat.index --corpus_path /tmp/scale/corpus.jsonl --retriever_name e5
            --retriever_model /tmp/scale/e5_base_random --faiss_gpu --gpu_search torch)
  else  # BM25 over the bundled corpus
    [ -d /tmp/paper_bm25/bm25 ] || python3 -c "from search_r1.search.index_builder import build_bm25; build_bm25('example/corpus.jsonl', '/tmp/paper_bm25')" || exit 1
    server=(--index_path /tmp/paper_bm25/bm25 --corpus_path example/corpus.jsonl --retriever_name bm25)
  fi
  python3 -m search_r1.search.retrieval_server "${server[@]}" --port 8000 > "$runs/retriever.log" 2>&1 &
  retriever_pid=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:8000/health > /dev/null && break; sleep 1; done
fi
curl -s http://127.0.0.1:8000/health; echo
# 3. The runs: paper lengths (Search-R1's train_*.sh), one GPU's share of the batch: the recipe
# +recipe=paper_scale_one_gpu (verl/trainer/config/recipe/) on the script's own.
common=(
  +recipe=paper_scale_one_gpu trainer.total_training_steps="$steps"
  data.train_batch_size="$batch" actor_rollout_ref.actor.ppo_mini_batch_size=$((batch / 2))
)
[ -n "${MAX_TURNS:-}" ] && common+=(max_turns="$MAX_TURNS")
[ -n "${GPU_MEM_UTIL:-}" ] && common+=(actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEM_UTIL")
[ -n "${MAX_MODEL_LEN:-}" ] && common+=(actor_rollout_ref.rollout.max_model_len="$MAX_MODEL_LEN")
read -r -a extra <<< "${EXTRA:-}"
common+=("${extra[@]}")
summarize() {  # the summary JSON and paper_scale.json's "train", rewritten after every run (a cut hold keeps them)
  python3 benchmarks/paper_scale_summary.py --runs_dir "$runs" --shape "$shape" --batch "$batch" \
    --num_gpus "$gpus" --max_prompt_length 4096 --model "$model" --retriever "${RETRIEVER:-bm25}" \
    --output "$summary" --into "$out/paper_scale.json" > /dev/null || true
}
run_algo() {  # name script extra-overrides...
  local name=$1${VARIANT:+_$VARIANT} script=$2; shift 2
  echo "== $name: $shape ($model), $gpus GPU(s), batch $batch, max_prompt_length 4096, $steps steps =="
  mkdir -p "$runs/$name" && printf '%s\n' "${common[@]}" "$@" > "$runs/$name/overrides.txt"  # for the report
  # the whole GPU's peak (every process: the engine core apart from the worker, the scale retriever)
  python3 benchmarks/gpu_peak.py --out "$runs/$name/gpu_peak.json" & local sampler=$!
  N_GPUS=$gpus BASE_MODEL="$model" DATA_DIR="$data" ROLLOUT_NAME=vllm \
    RETRIEVER_URL=http://127.0.0.1:8000/retrieve EXPERIMENT_NAME="paper-$name" CKPT_DIR="/tmp/ckpt-paper-$name-${gpus}gpu" \
    timeout -k 10 "${RUN_TIMEOUT:-1200}" bash "$script" "${common[@]}" trainer.log_dir="$runs/$name" "$@"
  echo "$name exit: $?"
  kill "$sampler" 2> /dev/null; wait "$sampler" 2> /dev/null
  summarize
}
algos=${ALGOS:-grpo,ppo}
[[ ,$algos, == *,grpo,* ]] && run_algo grpo train_grpo.sh actor_rollout_ref.rollout.n=5
[[ ,$algos, == *,ppo,* ]] && run_algo ppo train_ppo.sh
[ -n "$retriever_pid" ] && kill "$retriever_pid"
nvidia-smi --query-gpu=memory.used --format=csv || true
