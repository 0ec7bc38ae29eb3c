#!/usr/bin/env bash
# Search-R1 PPO training (GAE + critic, KL in the reward).
#
#   bash train_ppo.sh                         # no GPU: the embedded default (SmolLM2-135M, example/ data,
#                                             # local BM25 retriever), a few steps on CPU
#   N_GPUS=8 BASE_MODEL=Qwen/Qwen2.5-3B DATA_DIR=data/nq_search bash train_ppo.sh   # the paper's recipe
#   bash train_ppo.sh trainer.total_training_steps=3   # any Hydra override passes through
#
# Variables (defaults: paper recipe on a GPU machine, embedded default otherwise):
#   N_GPUS, BASE_MODEL, DATA_DIR, EXPERIMENT_NAME, RETRIEVER_URL, ROLLOUT_NAME, CKPT_DIR, WARM_START
set -euo pipefail
cd "$(dirname "$0")"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python}
source scripts/require_python.sh
N_GPUS=${N_GPUS:-$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)}
RETRIEVER_URL=${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}

if [ "${N_GPUS}" -gt 0 ]; then
  require_python_modules "$(basename "$0")" torch transformers ray hydra tensordict httpx
  # Paper recipe (Search-R1 train_ppo.sh: NQ+HotpotQA, 3B base model).
  BASE_MODEL=${BASE_MODEL:-Qwen/Qwen2.5-3B}
  DATA_DIR=${DATA_DIR:-data/nq_search}
  EXPERIMENT_NAME=${EXPERIMENT_NAME:-nq-search-r1-ppo-$(basename "$BASE_MODEL" | tr 'A-Z' 'a-z')-em}
  ARGS=(
    trainer.n_gpus_per_node="$N_GPUS" actor_rollout_ref.rollout.name="${ROLLOUT_NAME:-vllm}"
    data.train_batch_size=512 data.val_batch_size=256
    actor_rollout_ref.actor.ppo_mini_batch_size=256 actor_rollout_ref.actor.ppo_micro_batch_size=64
    actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.95
    critic.optim.lr=1e-5 critic.optim.lr_warmup_steps_ratio=0.05 critic.ppo_micro_batch_size=8
    trainer.total_epochs=15 trainer.total_training_steps=1005 trainer.save_freq=100 trainer.test_freq=50
  )
else
  # Embedded default: small enough for 2 CPU cores in minutes. SmolLM2 first gets a short SFT warm
  # start (cached after the first run) so that GRPO/PPO groups have reward spread (docs/sft.md).
  # It needs the training stack and, for the local BM25 retriever it starts, fastapi/uvicorn/bm25s.
  require_python_modules "$(basename "$0")" torch transformers ray hydra tensordict httpx fastapi uvicorn bm25s
  # Without BASE_MODEL the model is SmolLM2 and without DATA_DIR the example data (data/example_search),
  # both prepared by scripts/quickstart.py after it has checked the configuration.
  export WARM_START=${WARM_START:-1}
  EXPERIMENT_NAME=${EXPERIMENT_NAME:-example-ppo-smollm2}
  source scripts/embedded_cpu_args.sh
  ARGS=(
    data.train_batch_size=4
    actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size=2
    "${EMBEDDED_CPU_ARGS[@]}"
  )
fi

# The user's choices only: quickstart.py fills in the embedded defaults (and leaves a DATA_DIR it was given unwritten).
CHOSEN=()
[ -n "${BASE_MODEL:-}" ] && CHOSEN+=(actor_rollout_ref.model.path="$BASE_MODEL")
[ -n "${DATA_DIR:-}" ] && CHOSEN+=(--data-dir "$DATA_DIR")
# Checkpoints follow the experiment name (trainer.experiment_name=NAME moves them too) unless CKPT_DIR is set.
CKPT_DEFAULT='checkpoints/${.experiment_name}'
exec $PYTHON scripts/quickstart.py --retriever-url "$RETRIEVER_URL" "${CHOSEN[@]}" \
  algorithm.adv_estimator=gae algorithm.use_kl_in_reward=true actor_rollout_ref.actor.use_kl_loss=false \
  trainer.experiment_name="$EXPERIMENT_NAME" trainer.default_local_dir="${CKPT_DIR:-$CKPT_DEFAULT}" \
  retriever.url="$RETRIEVER_URL" "${ARGS[@]}" "$@"
