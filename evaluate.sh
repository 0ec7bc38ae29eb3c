#!/usr/bin/env bash
# Greedy multi-turn evaluation with search: Search-R1's per-source exact-match table (Table 2) with 95%
# bootstrap intervals, through the training's own agent loop, environment, prompt and reward.
#
#   bash evaluate.sh                         # no GPU: the embedded default (the quick start's latest checkpoint,
#                                            # else the SmolLM2 warm start, on the example/ test sets, with a
#                                            # local BM25 retriever started and stopped here)
#   bash evaluate.sh --max_per_source 5      # a quick look: the first 5 questions of each data source
#   bash evaluate.sh --html                  # also report.html: every trajectory, in a browser
#   BASE_MODEL=checkpoints/nq-search-r1-ppo/global_step_100/huggingface DATA_DIR=data/nq_search \
#     RETRIEVER_URL=http://127.0.0.1:8000/retrieve bash evaluate.sh     # a checkpoint on the test merge
#   bash evaluate.sh data.val_batch_size=64  # any Hydra override passes through
#   bash evaluate.sh --compare A/evaluation.json B/evaluation.json    # per-source differences + intervals
#
# Variables: N_GPUS, BASE_MODEL (a checkpoint's huggingface/ export, its global_step_N folder, or a hub id;
#   no GPU and unset: the latest export under CKPT_DIR, default checkpoints/example-grpo-smollm2 (the quick
#   start's run), else the warm start), DATA_DIR (holds test.parquet from
#   scripts/data_process/qa_search_test_merge.py), RETRIEVER_URL, ROLLOUT_NAME, OUTPUT_DIR (default: beside
#   the checkpoint, or evaluations/<model>/<data>), START_RETRIEVER (1: start a BM25 server over
#   example/corpus.jsonl at RETRIEVER_URL when none answers there, as train_*.sh do; the default without a
#   GPU; 0 with one, where the retriever must serve your corpus already), QA_DIR (build test.parquet from it).
# Outputs: OUTPUT_DIR/{evaluation.md,evaluation.json,questions.jsonl} (+ report.html with --html);
#   docs/evaluation.md explains them.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/common.sh
if [ "${1:-}" = "--compare" ]; then
  shift
  exec $PYTHON -m verl.trainer.evaluation.compare "$@"
fi
require_python_modules "$(basename "$0")" torch transformers ray hydra tensordict httpx
OPTS=()

if [ "${N_GPUS}" -gt 0 ]; then
  # The paper's setting: the test merge of the seven sources, a retriever that already serves wiki-18.
  BASE_MODEL=${BASE_MODEL:-Qwen/Qwen2.5-3B}
  DATA_DIR=${DATA_DIR:-data/nq_search}
  START_RETRIEVER=${START_RETRIEVER:-0}
  ARGS=(trainer.n_gpus_per_node="$N_GPUS" data.val_batch_size=512)
else
  # Embedded default: the example/ test sets (30 questions per source); a BM25 server over
  # example/corpus.jsonl at RETRIEVER_URL when none answers there (as train_*.sh); the model the quick
  # start trained (else its warm start; scripts/evaluate.py picks it after checking the configuration);
  # the embedded training's rollout with evaluation's turn budgets (+recipe=embedded_cpu_eval).
  [ -z "${DATA_DIR:-}" ] && QA_DIR=${QA_DIR:-example/qa}
  START_RETRIEVER=${START_RETRIEVER:-1}
  DATA_DIR=${DATA_DIR:-data/example_search}
  [ -z "${BASE_MODEL:-}" ] && OPTS+=(--latest-of "${CKPT_DIR:-checkpoints/$EMBEDDED_GRPO_EXPERIMENT}")
  ARGS=(+recipe=embedded_cpu_eval data.val_batch_size=32)
fi
[ -n "${ROLLOUT_NAME:-}" ] && ARGS+=(actor_rollout_ref.rollout.name="$ROLLOUT_NAME")
[ -n "${RETRIEVER_URL:-}" ] && OPTS+=(--retriever-url "$RETRIEVER_URL")
[ -n "${BASE_MODEL:-}" ] && OPTS+=(actor_rollout_ref.model.path="$BASE_MODEL")
[ -n "${QA_DIR:-}" ] && OPTS+=(--qa-dir "$QA_DIR")
[ "${START_RETRIEVER}" = 1 ] && OPTS+=(--start-retriever)
[ -n "${OUTPUT_DIR:-}" ] && OPTS+=(--output_dir "$OUTPUT_DIR")

exec $PYTHON scripts/evaluate.py --data-dir "$DATA_DIR" "${OPTS[@]}" "${ARGS[@]}" "$@"
