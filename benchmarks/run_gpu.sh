#!/usr/bin/env bash
# Device-side driver of the GPU benchmarks (issue 7): generation, then the actor update.
# Usage on the H200, from the repo root, after .whl/install.sh filled /tmp/site (tensordict is needed
# by verl.protocol; vllm for the vLLM column):
#   bash benchmarks/run_gpu.sh                 # 0.5B and 1.5B shapes
#   SHAPES=qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b bash benchmarks/run_gpu.sh
#   TRAIN_ONLY=1 bash benchmarks/run_gpu.sh    # update_actor only (no generation, no vLLM), < 5 min
# Each benchmark has its own timeout and rewrites its JSON after every configuration, so a timeout
# keeps the finished part. JSON lands in "$OUT" (the device tool brings it back) or benchmarks/results.
# All figures come from randomly initialised weights (stated in every JSON).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0
# vLLM's engine in the benchmark's own process: it initialises CUDA before vLLM starts, and a
# multiprocess engine forks after that and fails.
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
out=${OUT:-benchmarks/results}
mkdir -p "$out"
train_only=${TRAIN_ONLY:-0}
default_shapes=qwen2.5-0.5b,qwen2.5-1.5b
[ "$train_only" = 1 ] && default_shapes=qwen2.5-1.5b,qwen2.5-0.5b  # the goal shape first
shapes=${SHAPES:-$default_shapes}
gen_timeout=${GEN_TIMEOUT:-330}
if [ "$train_only" = 1 ]; then train_timeout=${TRAIN_TIMEOUT:-280}; else train_timeout=${TRAIN_TIMEOUT:-240}; fi
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -c "import tensordict; print('tensordict', tensordict.__version__)" 2>&1 | tail -1

if [ "$train_only" = 1 ]; then
  echo "== generation skipped (TRAIN_ONLY=1) =="
else
  python3 -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
  echo "== generation (timeout ${gen_timeout}s) =="
  timeout -k 10 "$gen_timeout" python3 benchmarks/gpu_generation.py --shapes "$shapes" --out_dir "$out" \
      --time_budget_s $((gen_timeout - 40)) ${GEN_ARGS:-}
  echo "generation exit: $?"
fi

echo "== update_actor (timeout ${train_timeout}s) =="
timeout -k 10 "$train_timeout" python3 benchmarks/gpu_train.py --shapes "$shapes" --out_dir "$out" \
    --time_budget_s $((train_timeout - 50)) ${TRAIN_ARGS:-}
echo "train exit: $?"
nvidia-smi --query-gpu=memory.used --format=csv || true
ls -l "$out"
