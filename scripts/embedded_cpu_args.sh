# Overrides shared by train_ppo.sh, train_grpo.sh and evaluate.sh for the embedded CPU default (sourced,
# not run): sizes and precision that fit SmolLM2-135M on 2 CPU cores in minutes. Batch sizes and the
# algorithm stay in each script. The training data (scripts/quickstart.py) are HotpotQA train
# questions, whose gold paragraphs example/corpus.jsonl holds.
# The quick start's run (train_grpo.sh's experiment); evaluate.sh without BASE_MODEL takes its latest export.
EMBEDDED_GRPO_EXPERIMENT=example-grpo-smollm2
# The rollout as training and evaluation both see it (context and per-turn budgets, engine, precision).
EMBEDDED_ROLLOUT_ARGS=(
  trainer.n_gpus_per_node=1 actor_rollout_ref.rollout.name="${ROLLOUT_NAME:-vllm}"
  data.max_prompt_length=1024 data.max_start_length=256 data.max_response_length=48 data.max_obs_length=128
  actor_rollout_ref.rollout.dtype=float32
)
# Evaluation's per-turn budget: a whole search turn and a whole answer turn of the warm start fit (its
# demonstrations' search turns are 34-68 SmolLM2 tokens, answer turns 22-49: scripts/make_sft_data.py
# output, 2026-12-01); training keeps 48 for speed.
EMBEDDED_EVAL_ARGS=(data.max_response_length=96)
# Training reward: Search-R1's format-aware variant (qa_em_format): 1 for an exact match, 0.2 for a
# well-formed trajectory, +0.1 when a retrieved passage holds a gold answer, 0.1 for a malformed one
# with an answer. With EM alone a 135M model is almost never right, so a few steps would score 0
# everywhere and every advantage would be 0 (docs/benchmarks_learning.md).
EMBEDDED_CPU_ARGS=(
  "${EMBEDDED_ROLLOUT_ARGS[@]}"
  reward_model.structure_format_score=0.2 reward_model.retrieval_score=0.1 reward_model.final_format_score=0.1
  data.val_batch_size=8 data.val_data_num=8
  actor_rollout_ref.rollout.log_prob_micro_batch_size=4 actor_rollout_ref.ref.log_prob_micro_batch_size=4
  critic.ppo_micro_batch_size=2
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0
  critic.optim.lr=1e-5 critic.optim.lr_warmup_steps_ratio=0.0
  actor_rollout_ref.model.enable_gradient_checkpointing=false actor_rollout_ref.model.max_packed_row_len=1024
  actor_rollout_ref.actor.fsdp_config.param_offload=false
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=false actor_rollout_ref.ref.fsdp_config.param_offload=false
  critic.model.fsdp_config.param_offload=false
  critic.model.fsdp_config.optimizer_offload=false
  actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32 critic.model.fsdp_config.mixed_precision=fp32
  trainer.total_training_steps="${TOTAL_STEPS:-3}" trainer.save_freq=3 trainer.test_freq=3
  trainer.val_before_train=false trainer.logger=[console,jsonl]
)
