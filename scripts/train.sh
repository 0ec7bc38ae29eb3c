#!/usr/bin/env bash
# The body of train_ppo.sh and train_grpo.sh: `bash scripts/train.sh ppo|grpo [key=value ...]`.
# With a GPU: Search-R1's recipe (+recipe=search_r1_<algo>: NQ+HotpotQA, a 3B base model); without
# one: the embedded default (+recipe=embedded_cpu_<algo>: SmolLM2-135M with a cached SFT warm start,
# example/ data, a local BM25 retriever, a few steps). scripts/quickstart.py checks the whole
# configuration, then prepares what is missing and runs python -m verl.trainer.main_ppo.
set -euo pipefail
cd "$(dirname "$0")/.."
ALGO=$1
shift
source scripts/common.sh
if [ "${N_GPUS}" -gt 0 ]; then
  require_python_modules "train_$ALGO.sh" torch transformers ray hydra tensordict httpx
  BASE_MODEL=${BASE_MODEL:-Qwen/Qwen2.5-3B}
  DATA_DIR=${DATA_DIR:-data/nq_search}
  EXPERIMENT_NAME=${EXPERIMENT_NAME:-nq-search-r1-$ALGO-$(basename "$BASE_MODEL" | tr 'A-Z' 'a-z')-em}
  ARGS=(+recipe=search_r1_"$ALGO" trainer.n_gpus_per_node="$N_GPUS")
else
  # The local BM25 retriever it starts needs fastapi/uvicorn/bm25s too.
  require_python_modules "train_$ALGO.sh" torch transformers ray hydra tensordict httpx fastapi uvicorn bm25s
  # Without BASE_MODEL the model is SmolLM2 (its SFT warm start so that groups have reward spread:
  # docs/sft.md) and without DATA_DIR the example data, both prepared by scripts/quickstart.py.
  export WARM_START=${WARM_START:-1}
  EXPERIMENT_NAME=${EXPERIMENT_NAME:-example-$ALGO-smollm2}
  ARGS=(+recipe=embedded_cpu_"$ALGO")
  # Search-R1's format-aware reward scores its own tags: in its environment only (env.name's default).
  env_name=search_r1
  for arg in "$@"; do case "$arg" in env.name=* | +env.name=* | ++env.name=*) env_name=${arg#*=} ;; esac; done
  [ "$env_name" = search_r1 ] && ARGS+=(+recipe=format_reward)
  [ -n "${TOTAL_STEPS:-}" ] && ARGS+=(trainer.total_training_steps="$TOTAL_STEPS")
fi
# The user's choices only: quickstart.py fills in the embedded defaults (and leaves a DATA_DIR it was given unwritten).
[ -n "${ROLLOUT_NAME:-}" ] && ARGS+=(actor_rollout_ref.rollout.name="$ROLLOUT_NAME")
[ -n "${BASE_MODEL:-}" ] && ARGS+=(actor_rollout_ref.model.path="$BASE_MODEL")
OPTS=()
[ -n "${DATA_DIR:-}" ] && OPTS+=(--data-dir "$DATA_DIR")
[ -n "${RETRIEVER_URL:-}" ] && OPTS+=(--retriever-url "$RETRIEVER_URL")
# Checkpoints follow the experiment name (trainer.experiment_name=NAME moves them too) unless CKPT_DIR is set.
CKPT_DEFAULT='checkpoints/${.experiment_name}'
exec $PYTHON scripts/quickstart.py "${OPTS[@]}" "${ARGS[@]}" trainer.experiment_name="$EXPERIMENT_NAME" \
  trainer.default_local_dir="${CKPT_DIR:-$CKPT_DEFAULT}" "$@"
