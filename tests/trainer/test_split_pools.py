"""Split pools (``actor_rollout_ref.hybrid_engine=false``) through the real entry point on Ray: the
FSDP actor on the training rank, the engine on a rank of its own (``rollout.n_gpus_per_node``), the
actor's weights broadcast to it over gloo after every update.

* staleness 0, transformers engine, GRPO, PPO (the critic on the training rank) and GRPO with LoRA
  (its merged weights sent): every step's rollout log-probs are those of the actor that trains on
  them (the engine got each update), while the policy moved away from its start;
* staleness 1 (``+recipe=one_step_off_policy``), vLLM CPU engine: each step from the second trains
  on a batch rolled out beside the previous update, and a resume from the checkpoint pushes the
  saved weights to the engine before its first rollout.
"""

from __future__ import annotations

import pytest

from tests.trainer.conftest import qa_parquet, retriever_url  # noqa: F401  (fixtures)
from tests.trainer.helpers import read_metrics, run_main, tiny_overrides

pytestmark = pytest.mark.slow

# greedy: the engine's log-probs are then those of the weights it holds, comparable to the actor's
SPLIT = ["trainer.backend=ray", "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1",
         "actor_rollout_ref.rollout.do_sample=false"]


# the actor's KL to the reference (its starting weights): GRPO's KL loss, PPO's in-reward KL (k1, signed)
KL_TO_START = {"grpo": "actor/kl_loss", "ppo": "actor/reward_kl_penalty"}


def _run(overrides: list[str]):
    result = run_main(overrides)
    assert result.returncode == 0, result.stdout[-3000:] + "\n" + result.stderr[-5000:]
    return result


LORA = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=all-linear"]


@pytest.mark.parametrize("algo, extra", [("grpo", []), ("ppo", []), ("grpo", LORA)], ids=["grpo", "ppo", "grpo-lora"])
def test_split_pools_engine_serves_the_actors_weights_after_each_update(tiny_qwen_path, qa_parquet,  # noqa: F811
                                                                       retriever_url, tmp_path, algo, extra):  # noqa: F811
    out = tmp_path / "run"
    result = _run(tiny_overrides(tiny_qwen_path, qa_parquet, retriever_url, out, algo) + SPLIT + extra + [
        "trainer.total_training_steps=3", "trainer.save_freq=-1",
        # an old-log-prob pass beside the rollout's own log-probs: their gap is the engine's staleness
        "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0"])
    assert "rollout pool placement: 1 rank(s) on 1 Ray node(s)" in result.stdout
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["rollout/policy_lag"] for m in metrics] == [0.0, 0.0, 0.0]
    for m in metrics:
        assert m["weight_sync/bytes"] > 0 and {"timing_s/weight_sync", "timing_s/rollout_wait"} <= set(m)
        assert m["actor/rollout_vs_actor_log_prob_diff"] < 1e-5, m
    # the actor moved away from its start: a KL of 1e-3 is a mean |log-prob change| of ~0.04, which an
    # engine left on the first weights would show against the 1e-5 bound above
    assert max(abs(m[KL_TO_START[algo]]) for m in metrics) > 1e-3, metrics


def test_split_pools_one_step_off_policy_and_resume(tiny_qwen_path, qa_parquet, retriever_url,  # noqa: F811
                                                    tmp_path):
    out = tmp_path / "run"
    common = tiny_overrides(tiny_qwen_path, qa_parquet, retriever_url, out, "grpo") + SPLIT + [
        "actor_rollout_ref.rollout.name=vllm", "+recipe=one_step_off_policy", "trainer.save_freq=2",
        "actor_rollout_ref.rollout.engine_process=false", "actor_rollout_ref.rollout.frontend_process=false"]
    _run(common + ["trainer.total_training_steps=2"])
    metrics = read_metrics(out)
    assert [m["rollout/policy_lag"] for m in metrics] == [0.0, 1.0]
    assert all(m["weight_sync/bytes"] > 0 for m in metrics)
    result = _run(common + ["trainer.total_training_steps=3"])
    assert "resumed from" in result.stdout
    resumed = read_metrics(out)[-1]
    # the resume's first batch was rolled out on the saved weights (pushed at the resume): no lag
    assert resumed["step"] == 3 and resumed["rollout/policy_lag"] == 0.0
    assert resumed["actor/rollout_vs_actor_log_prob_diff"] < 1e-4, resumed
    assert resumed["actor/kl_loss"] > 1e-3, resumed  # the saved actor is far from the engine's first weights
