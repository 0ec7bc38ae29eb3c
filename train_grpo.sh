#!/usr/bin/env bash
# Search-R1 GRPO training (group-normalised outcome advantages, no critic, KL loss in the actor).
#
#   bash train_grpo.sh                         # no GPU: the embedded default (SmolLM2-135M, example/ data,
#                                             # local BM25 retriever), a few steps on CPU
#   N_GPUS=8 BASE_MODEL=Qwen/Qwen2.5-3B DATA_DIR=data/nq_search bash train_grpo.sh   # the paper's recipe
#   bash train_grpo.sh trainer.total_training_steps=3   # any Hydra override passes through
#   bash train_grpo.sh +recipe=NAME                      # a preset of verl/trainer/config/recipe/ on top
#
# Recipes: search_r1_grpo with a GPU, embedded_cpu_grpo without (verl/trainer/config/recipe/).
# Variables: N_GPUS, BASE_MODEL, DATA_DIR, EXPERIMENT_NAME, RETRIEVER_URL, ROLLOUT_NAME, CKPT_DIR,
#   WARM_START, TOTAL_STEPS (scripts/train.sh)
exec bash "$(dirname "$0")/scripts/train.sh" grpo "$@"
