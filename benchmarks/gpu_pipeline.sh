#!/usr/bin/env bash
# The real pipeline on one GPU (issue 7): GRPO (vLLM rollout) and PPO (transformers rollout) steps
# of the embedded job -- SmolLM2-135M-Instruct (real weights), example/ data, a local BM25 retrieval
# server started by quickstart on the same machine -- in bf16 with FSDP2, remove-padding and dynamic
# batch sizes. Each run's metrics.jsonl (timing_s/*, perf/max_memory_*_gb/<phase>, scores) lands in
# "$OUT/<algo>" and summary lines are printed.
# Usage on the device, repo root, after .whl/install.sh filled /tmp/site:
#   STEPS=3 bash benchmarks/gpu_pipeline.sh
#   MODEL=/tmp/q05 SCALE=searchr1 ALGOS=grpo STEPS=2 bash benchmarks/gpu_pipeline.sh
# MODEL: any HF folder (e.g. a random-init Qwen2.5 shape from benchmarks/save_random_model.py).
# SCALE=searchr1: Search-R1's GRPO recipe per GPU (512 prompts / 8 GPUs = 64 prompts x n=5,
# responses <= 500 tokens, observations <= 500, 2 turns, mini-batch 256/8 = 32 prompts).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHON=python3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0
out=${OUT:-benchmarks/results}/pipeline
steps=${STEPS:-3}
mkdir -p "$out"
model=${MODEL:-$(python3 -c 'from verl.utils.model_zoo import smollm2_dir; print(smollm2_dir())' | tail -1)}
echo "model: $model"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
common=(
  trainer.total_training_steps="$steps" trainer.save_freq="$steps" trainer.test_freq="$steps"
  trainer.val_before_train=false trainer.logger=[console,jsonl]
  data.train_batch_size=32 data.val_batch_size=64 data.val_data_num=64
  data.max_response_length=256 data.max_obs_length=256 max_turns=2
  actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size=16
  actor_rollout_ref.rollout.log_prob_micro_batch_size=64 actor_rollout_ref.ref.log_prob_micro_batch_size=64
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768
  actor_rollout_ref.model.use_remove_padding=true actor_rollout_ref.model.enable_gradient_checkpointing=true
  actor_rollout_ref.rollout.gpu_memory_utilization=${GPU_MEM_UTIL:-0.1} actor_rollout_ref.actor.optim.lr=1e-6
)
if [ "${SCALE:-}" = searchr1 ]; then
  common+=(
    data.train_batch_size=64 actor_rollout_ref.rollout.n=5 data.max_response_length=500
    data.max_obs_length=500 data.max_start_length=2048 data.max_prompt_length=4096 max_turns=2
    actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.ppo_micro_batch_size=8
    actor_rollout_ref.rollout.log_prob_micro_batch_size=128 actor_rollout_ref.ref.log_prob_micro_batch_size=128
  )
fi
# EXTRA: more key=value overrides for every run (word-split, last so they win), e.g. a smaller token
# budget per micro-batch when little GPU memory is free.
read -r -a extra <<< "${EXTRA:-}"
common+=("${extra[@]}")
run_algo() {  # name script rollout extra-overrides...
  local name=$1 script=$2 rollout=$3; shift 3
  echo "== $name ($rollout rollout) =="
  N_GPUS=1 BASE_MODEL="$model" DATA_DIR=data/example_search ROLLOUT_NAME="$rollout" \
    EXPERIMENT_NAME="gpu-$name" CKPT_DIR="/tmp/ckpt-$name-$(basename "$model")" \
    timeout -k 10 "${RUN_TIMEOUT:-260}" bash "$script" "${common[@]}" trainer.log_dir="$out/$name" "$@"
  echo "$name exit: $?"
  python3 - "$out/$name/metrics.jsonl" <<'EOF' || true
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
for row in rows:
    keep = {k: round(v, 3) for k, v in row.items() if isinstance(v, (int, float)) and
            (k.startswith(("timing_s/", "perf/", "critic/score", "response_length/mean", "val/")) or k == "step")}
    print(json.dumps(keep))
EOF
}
algos=${ALGOS:-grpo,ppo}
[[ ,$algos, == *,grpo,* ]] && run_algo grpo train_grpo.sh vllm
[[ ,$algos, == *,ppo,* ]] && run_algo ppo train_ppo.sh hf critic.ppo_micro_batch_size=16 critic.model.use_remove_padding=true
nvidia-smi --query-gpu=memory.used --format=csv || true
