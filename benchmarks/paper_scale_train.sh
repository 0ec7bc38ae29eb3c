#!/usr/bin/env bash
# Issue 21, part 2: train_grpo.sh and train_ppo.sh at the paper's lengths on ONE H200, for the random
# Qwen2.5-3B shape biased to search (benchmarks/paper_scale_prep.py: turns close with </search> after
# ~150 tokens, prompts end with a forced "<search>"), against the part-1 retriever (10M synthetic e5
# Flat vectors in fp16 on the same GPU, e5-base-shaped encoder). Per run: metrics.jsonl (timing_s/*,
# perf/max_memory_*_gb/<phase>, perf/throughput_tokens_per_s, perf/mfu/actor) in $OUT/paper_train/<algo>,
# and a summary $OUT/paper_scale_train.json (per run: max_prompt_length, batch, per-phase medians).
# Prepared, not yet run. Usage on the device, repo root, machine warm from part 1 (/tmp/scale filled,
# /tmp/site holding .whl plus vLLM: bash ../shared/device/wheels.sh --vllm, parts carried one per call):
#   STEPS=3 ALGOS=grpo bash benchmarks/paper_scale_train.sh      # then ALGOS=ppo in the next call
# Env: STEPS (3), ALGOS (grpo,ppo), BATCH (64 prompts = the paper's 512 over 8 GPUs; 512 = the whole
# paper batch on one GPU, ~8x longer), MAX_TURNS (4; the paper uses 2-4), RUN_TIMEOUT (520 s per run),
# GPU_MEM_UTIL (0.35: vLLM's share; the retriever holds ~18 GB), MAX_MODEL_LEN (unset: the config's;
# set e.g. 4608 while rollout.max_model_len still defaults to 2048), EXTRA (more overrides),
# MODEL + DATA (another policy and data folder, e.g. the real SmolLM2 with its chat-template data:
# MODEL=$(python3 -c 'from verl.utils.model_zoo import smollm2_dir; print(smollm2_dir())') DATA=/tmp/paper_data_src).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHON=python3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0
out=${OUT:-benchmarks/results}
steps=${STEPS:-3}
batch=${BATCH:-64}
mkdir -p "$out/paper_train"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
# 1. Model and data (kept in /tmp between calls on a warm machine).
model=${MODEL:-/tmp/q3b-search}
data=${DATA:-/tmp/paper_data}
if [ -z "${MODEL:-}" ] && [ ! -f /tmp/q3b-search/search_bias.json ]; then
  tok=$(python3 -c 'from verl.utils.model_zoo import smollm2_dir; print(smollm2_dir())' | tail -1)
  python3 benchmarks/save_random_model.py --shape qwen2.5-3b --tokenizer "$tok" --out /tmp/q3b || exit 1
  python3 benchmarks/paper_scale_prep.py model --src /tmp/q3b --out /tmp/q3b-search || exit 1
  rm -rf /tmp/q3b
fi
if [ ! -f /tmp/paper_data/train.parquet ] || [ ! -f /tmp/paper_data_src/train.parquet ]; then
  python3 -c "from pathlib import Path; import scripts.quickstart as q; q.ensure_data(Path('/tmp/paper_data_src'), Path('example/qa'))" || exit 1
  python3 benchmarks/paper_scale_prep.py data --src /tmp/paper_data_src --out /tmp/paper_data || exit 1
fi
# 2. The part-1 retriever on the same GPU (torch-sharded fp16 Flat; FAISS GPU when /tmp/site-faiss imports).
retriever_pid=""
if ! curl -sf http://127.0.0.1:8000/health > /dev/null; then
  [ -f /tmp/scale/synthetic_Flat.index ] || { echo "no /tmp/scale: run benchmarks/device/retriever_scale.sh first"; exit 1; }
  python3 -m search_r1.search.retrieval_server --index_path /tmp/scale/synthetic_Flat.index \
      --corpus_path /tmp/scale/corpus.jsonl --retriever_name e5 --retriever_model /tmp/scale/e5_base_random \
      --faiss_gpu --gpu_search torch --port 8000 > "$out/paper_train/retriever.log" 2>&1 &
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
run_algo() {  # name script extra-overrides...
  local name=$1 script=$2; shift 2
  echo "== $name: $model, batch $batch, max_prompt_length 4096, $steps steps =="
  N_GPUS=1 BASE_MODEL="$model" DATA_DIR="$data" ROLLOUT_NAME=vllm \
    RETRIEVER_URL=http://127.0.0.1:8000/retrieve EXPERIMENT_NAME="paper-$name" CKPT_DIR="/tmp/ckpt-paper-$name" \
    timeout -k 10 "${RUN_TIMEOUT:-520}" bash "$script" "${common[@]}" trainer.log_dir="$out/paper_train/$name" "$@"
  echo "$name exit: $?"
}
algos=${ALGOS:-grpo,ppo}
[[ ,$algos, == *,grpo,* ]] && run_algo grpo train_grpo.sh actor_rollout_ref.rollout.n=5
[[ ,$algos, == *,ppo,* ]] && run_algo ppo train_ppo.sh
# 4. Summary JSON (rewritten with whatever runs have metrics so far).
python3 benchmarks/paper_scale_summary.py --runs_dir "$out/paper_train" --batch "$batch" --max_prompt_length 4096 --model "$model" \
  --output "$out/paper_scale_train.json" || true
[ -n "$retriever_pid" ] && kill "$retriever_pid"
nvidia-smi --query-gpu=memory.used --format=csv || true
