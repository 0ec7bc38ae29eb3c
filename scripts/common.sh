# Sourced (not run) by train_ppo.sh / train_grpo.sh (through scripts/train.sh) and evaluate.sh: the
# environment every entry point sets and the machine it runs on. Defaults of the run itself live in
# the config dataclasses and the recipes (verl/trainer/config/recipe/), not here.
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python}
source scripts/require_python.sh
N_GPUS=${N_GPUS:-$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)}
# The quick start's run (train_grpo.sh without a GPU): evaluate.sh without BASE_MODEL takes its latest export.
EMBEDDED_GRPO_EXPERIMENT=example-grpo-smollm2
