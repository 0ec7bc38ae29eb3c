"""The rollout across the controller/worker boundary: the agent loop runs in the Ray workers.

* two real Ray rollout ranks (transformers engine, SmolLM2) run their halves of a batch beside
  their engines, in async and in sync mode, and give, row for row, the greedy result of the sync
  loop beside an engine in this process; sync mode reports every turn's progress back;
* one trainer step through the real entry point with ``rollout.mode=async`` and the vLLM CPU
  engine colocated in the actor worker (generation, update, weight push).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.rollout.scripted import search_loop
from tests.rollout.conftest import chat_prompt
from tests.trainer.conftest import qa_parquet, retriever_url  # noqa: F401  (fixtures)
from tests.trainer.helpers import read_metrics, run_main, tiny_overrides
from verl.protocol import DataProto
from verl.workers.rollout.base import SamplingParams

pytestmark = pytest.mark.slow

PREFIX = "<think>I need to look this up.</think>\n<search>"
QUESTIONS = ["Where was Manuel Díaz Rodríguez born?", "What did Manuel Díaz Rodríguez write?",
             "Who wrote Hamlet?", "What is the capital of France?"]


@pytest.fixture(scope="module")
def rollout_group(smollm2_path):
    """Two Ray workers with the ``rollout`` role (a transformers engine each, no actor)."""
    import ray

    from verl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    init_ray(num_cpus=2, env_vars={"PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
                                   "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                   "TOKENIZERS_PARALLELISM": "false"},
             object_store_memory=200 * 1024**2)
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=2, cpus_per_worker=0.2)
    config = {"model": {"path": smollm2_path, "trust_remote_code": False}, "actor": {},
              "rollout": {"name": "hf", "dtype": "float32", "log_prob_micro_batch_size_per_gpu": 4},
              "ref": {"log_prob_micro_batch_size_per_gpu": 4}}
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config=config, role="rollout"),
                           name_prefix="async_rollout", timeout_s=600)
    try:
        group.init_model()
        yield group
    finally:
        group.shutdown()
        pool.release()
        ray.shutdown()


def test_rollout_on_two_ray_ranks_equals_the_sync_loop_in_both_modes(rollout_group, hf_engine, tokenizer, retriever):
    from verl.trainer.ppo.rollout_adapter import WorkerGroupEngine

    # 5 rows on 2 ranks: one padding row; a row without a forced prefix ends without searching
    prompts = [chat_prompt(tokenizer, q, PREFIX) for q in QUESTIONS] + [chat_prompt(tokenizer, "Say hi.")]
    params = SamplingParams(temperature=0, max_tokens=48)
    workers = WorkerGroupEngine(rollout_group, world_size=2)
    outputs, turns = {}, []
    for name, mode, engine in (("here", "sync", hf_engine), ("async", "async", workers), ("sync", "sync", workers)):
        config = dict(max_turns=2, max_prompt_length=900, max_response_length=400, max_obs_length=200, mode=mode)
        manager = search_loop(tokenizer, engine, retriever, **config)
        outputs[name] = manager.run(DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts}), params,
                                    on_turn=turns.append if name == "sync" else None)
    here = outputs["here"]
    for name in ("async", "sync"):
        remote = outputs[name]
        assert len(remote) == len(prompts)
        for key in ("prompts", "responses", "response_mask", "attention_mask", "position_ids", "turns",
                    "valid_search", "valid_action", "finished", "truncated"):
            assert torch.equal(remote.batch[key], here.batch[key]), (name, key)
        torch.testing.assert_close(remote.batch["rollout_log_probs"], here.batch["rollout_log_probs"], atol=1e-4, rtol=0)
        assert remote.non_tensor_batch["action_prefix"].tolist() == ["<search>"] * 4 + [""]
        assert int(remote.batch["valid_search"][:4].min()) >= 1
    # the workers' turns came back: 6 rows (5 + 1 padding) over 2 ranks, summed; the last report has
    # every row of both ranks, none active (that they arrive during the call: test_remote_progress.py)
    assert turns and all(t.max_turns == 3 for t in turns) and turns[-1].rows == 6 and turns[-1].active == 0
    assert [t.turn for t in turns] == sorted(t.turn for t in turns) and turns[0].turn == 1
    assert {"generation_s", "tool_s", "engine_calls", "decode_steps"} <= set(outputs["sync"].meta_info["timing"])


def test_staleness_1_trains_beside_the_next_rollout_served_from_a_child_process(tiny_qwen_path, qa_parquet,  # noqa: F811
                                                                                retriever_url, tmp_path):  # noqa: F811
    """The one_step_off_policy arrangement on two Ray worker threads and the vLLM CPU engine served
    from a child process of the worker (``rollout.frontend_process``): from step 2 on each batch was
    sampled one update earlier (the next step's rollout ran beside this step's update, whose weight
    push through the engine process waited for it), the TIS correction saw the lag, the validation
    of step 2 waited for the rollout in flight, and the checkpoint of step 2 keeps the data position
    before the prompts of that rollout (6 rows, batches of 3: epoch 0, batch 2; drawing them made it
    epoch 1, batch 1)."""
    from verl.trainer.ppo.checkpointing import load_trainer_state

    out = tmp_path / "run"
    overrides = tiny_overrides(tiny_qwen_path, qa_parquet, retriever_url, out, "grpo") + [
        "actor_rollout_ref.rollout.name=vllm", "+recipe=one_step_off_policy", "trainer.backend=ray",
        "trainer.total_training_steps=3", "trainer.save_freq=2", "trainer.test_freq=2",
        # the engine core inside the served process (tests/rollout/test_engines.py covers it in one more)
        "actor_rollout_ref.rollout.engine_process=false"]
    result = run_main(overrides)
    assert result.returncode == 0, result.stdout[-3000:] + "\n" + result.stderr[-5000:]
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["rollout/policy_lag"] for m in metrics] == [0.0, 1.0, 1.0]
    for m in metrics:
        assert {"timing_s/rollout_wait", "actor/rollout_vs_actor_log_prob_diff", "timing_s/gen_engine",
                "timing_s/gen_loop", "critic/score/mean", "env/number_of_actions/mean"} <= set(m)
    assert "val/test_score/nq" in metrics[1]
    assert load_trainer_state(out / "global_step_2")["data"] == {"epoch": 0, "position": 2}
