#!/usr/bin/env bash
# Search-R1 PPO training (GAE + critic, KL in the reward).
#
#   bash train_ppo.sh                         # no GPU: the embedded default (SmolLM2-135M, example/ data,
#                                             # local BM25 retriever), a few steps on CPU
#   N_GPUS=8 BASE_MODEL=Qwen/Qwen2.5-3B DATA_DIR=data/nq_search bash train_ppo.sh   # the paper's recipe
#   bash train_ppo.sh trainer.total_training_steps=3   # any Hydra override passes through
#   bash train_ppo.sh +recipe=NAME                      # a preset of verl/trainer/config/recipe/ on top
#
# Recipes: search_r1_ppo with a GPU, embedded_cpu_ppo without (verl/trainer/config/recipe/).
# Variables: N_GPUS, BASE_MODEL, DATA_DIR, EXPERIMENT_NAME, RETRIEVER_URL, ROLLOUT_NAME, CKPT_DIR,
#   WARM_START, TOTAL_STEPS (scripts/train.sh)
exec bash "$(dirname "$0")/scripts/train.sh" ppo "$@"
