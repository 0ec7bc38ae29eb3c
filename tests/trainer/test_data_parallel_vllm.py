"""Two data-parallel ranks on one node, each with a vLLM engine of its own: what a machine of two GPUs
runs (``trainer.n_gpus_per_node=2``; here two CPU processes, FSDP over gloo). Each rank's engine is
built in a process whose torch.distributed world already holds both ranks (vLLM takes that world as
two external data-parallel groups of one rank each), rolls out its half of the batch, and takes the
weights each rank pushes after the update."""

from __future__ import annotations

import pytest

from tests.trainer.conftest import qa_parquet, retriever_url  # noqa: F401  (fixtures)
from tests.trainer.helpers import read_metrics, run_main, tiny_overrides

pytestmark = pytest.mark.slow


def test_two_ranks_each_with_a_vllm_engine_train_and_push_weights(tiny_qwen_path, qa_parquet,  # noqa: F811
                                                                  retriever_url, tmp_path):  # noqa: F811
    """Two GRPO steps. The engines sample the full distribution (top_p 1) and the update reports how far
    the rollout's log-probs are from the actor's (TIS on): equal to float precision at step 2 only if
    both ranks' pushes after step 1 reached their engines (with the push skipped it was 0.14 here)."""
    out = tmp_path / "run"
    overrides = tiny_overrides(tiny_qwen_path, qa_parquet, retriever_url, out, "grpo") + [
        "actor_rollout_ref.rollout.name=vllm", "trainer.backend=ray", "trainer.n_gpus_per_node=2",
        "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size=2", "actor_rollout_ref.rollout.log_prob_micro_batch_size=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size=2", "trainer.total_training_steps=2",
        "trainer.save_freq=-1", "actor_rollout_ref.rollout.top_p=1.0", "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0"]
    result = run_main(overrides)
    assert result.returncode == 0, result.stdout[-3000:] + "\n" + result.stderr[-5000:]
    assert "placement: 2 rank(s) on 1 Ray node(s)" in result.stdout
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["actor/rollout_vs_actor_log_prob_diff_max"] < 1e-4, m
