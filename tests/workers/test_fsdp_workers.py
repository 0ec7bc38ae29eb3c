"""FSDP2 workers in this process (world size 1, gloo): log-probs, updates, checkpoints, HF export."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.utils import fsdp_utils
from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker


@pytest.fixture(scope="module")
def actor_worker(tiny_qwen_path, configs):
    worker = ActorRolloutRefWorker(configs[0](tiny_qwen_path), role="actor_rollout_ref")
    worker.init_model()
    return worker


def _full_params(worker) -> dict[str, torch.Tensor]:
    from verl.utils.fsdp_utils import iter_full_params

    return {k: v.clone() for k, v in iter_full_params(worker.actor_module)}


def _prepared_batch(worker, batch_factory, seed=0):
    data = batch_factory(num_rows=6, seed=seed)
    data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
    data.batch["ref_log_probs"] = worker.compute_ref_log_prob(data).batch["ref_log_probs"]
    return data


def test_log_probs_ref_and_update(actor_worker, batch_factory, tiny_qwen_path):
    data = batch_factory(num_rows=6, seed=0)
    out = actor_worker.compute_log_prob(data)
    ref = actor_worker.compute_ref_log_prob(data)
    # the reference is the same checkpoint before any update, stored in the dtype the actor computes in
    # (bf16 on a GPU: no fp32 master copy for a frozen model; fp32 on a CPU-only machine)
    compute = fsdp_utils.compute_dtype(actor_worker.config.actor.fsdp_config.mixed_precision)
    assert {p.dtype for p in actor_worker.ref_module.parameters()} == {compute}
    assert {p.dtype for p in actor_worker.actor_module.parameters()} == {torch.float32}
    torch.testing.assert_close(ref.batch["ref_log_probs"], out.batch["old_log_probs"], atol=1e-5, rtol=0)
    assert out.batch["entropys"].shape == data.batch["responses"].shape
    before = _full_params(actor_worker)
    data.batch["old_log_probs"] = out.batch["old_log_probs"]
    data.batch["ref_log_probs"] = ref.batch["ref_log_probs"]
    metrics = actor_worker.update_actor(data).meta_info["metrics"]
    for key in ["actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/kl_loss",
                "actor/grad_norm", "actor/lr"]:
        assert key in metrics, key
    assert metrics["actor/lr"] == pytest.approx(1e-3)
    after = _full_params(actor_worker)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # the reference stays frozen
    ref_after = actor_worker.compute_ref_log_prob(data).batch["ref_log_probs"]
    torch.testing.assert_close(ref_after, ref.batch["ref_log_probs"], atol=0, rtol=0)
    # the colocated engine received the new weights, in its own dtype and on its own device (bf16 on a GPU)
    engine_state = actor_worker.rollout_engine.model.state_dict()
    for name in ["model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight"]:
        pushed = engine_state[name].cpu()
        torch.testing.assert_close(pushed, after[name].to(pushed.dtype), atol=0, rtol=0)


def test_generate_sequences(actor_worker):
    from verl.protocol import DataProto

    prompts = np.empty(2, dtype=object)
    prompts[0], prompts[1] = [100, 200, 300], [400, 500]
    data = DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts},
                               meta_info={"sampling_params": {"temperature": 0.0, "max_tokens": 4, "n": 1}})
    out = actor_worker.generate_sequences(data)
    assert len(out) == 2
    for ids, log_probs in zip(out.non_tensor_batch["output_token_ids"], out.non_tensor_batch["output_log_probs"]):
        assert 1 <= len(ids) <= 4 and len(log_probs) == len(ids)


def test_checkpoint_round_trip(actor_worker, batch_factory, tmp_path):
    data = _prepared_batch(actor_worker, batch_factory, seed=1)
    actor_worker.update_actor(data)  # optimizer state exists
    actor_worker.save_checkpoint(str(tmp_path / "ckpt"), global_step=1)
    saved_params = _full_params(actor_worker)
    saved_exp_avg = {k: v["exp_avg"].full_tensor().clone() for k, v in
                     zip(actor_worker.actor_module.state_dict(), actor_worker.actor_optimizer.state.values())}
    saved_lr_steps = actor_worker.lr_scheduler.last_epoch
    expected_draws = (torch.rand(3), np.random.rand(), random.random())
    actor_worker.update_actor(_prepared_batch(actor_worker, batch_factory, seed=2))
    assert any(not torch.equal(saved_params[k], v) for k, v in _full_params(actor_worker).items())
    actor_worker.load_checkpoint(str(tmp_path / "ckpt"))
    for key, value in _full_params(actor_worker).items():
        torch.testing.assert_close(value, saved_params[key], atol=0, rtol=0)
    for (key, state) in zip(actor_worker.actor_module.state_dict(), actor_worker.actor_optimizer.state.values()):
        torch.testing.assert_close(state["exp_avg"].full_tensor(), saved_exp_avg[key], atol=0, rtol=0)
    assert actor_worker.lr_scheduler.last_epoch == saved_lr_steps
    draws = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(draws[0], expected_draws[0]) and draws[1:] == expected_draws[1:]


def test_export_hf_loads_with_same_logits(actor_worker, batch_factory, tmp_path):
    actor_worker.export_hf(str(tmp_path / "hf"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    data = batch_factory(num_rows=3, seed=4)
    ids, mask = data.batch["input_ids"], data.batch["attention_mask"]
    with torch.no_grad():
        expected = actor_worker.actor_module(input_ids=ids, attention_mask=mask, use_cache=False).logits
        got = loaded(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (tmp_path / "hf" / "tokenizer.json").exists()


def test_critic_values_and_update(tiny_qwen_path, configs, batch_factory):
    torch.manual_seed(0)  # the value head starts random
    worker = CriticWorker(configs[1](tiny_qwen_path))
    worker.init_model()
    data = batch_factory(num_rows=6, seed=5)
    values = worker.compute_values(data).batch["values"]
    assert values.shape == data.batch["responses"].shape
    assert (values[data.batch["response_mask"] == 0] == 0).all()
    data.batch["values"] = values
    data.batch["returns"] = torch.linspace(-1, 1, values.numel()).view_as(values) * data.batch["response_mask"]
    losses = []
    for _ in range(5):
        metrics = worker.update_critic(data).meta_info["metrics"]
        losses.append(metrics["critic/vf_loss"])
        data.batch["values"] = worker.compute_values(data).batch["values"]
    assert losses[-1] < losses[0], losses
    for key in ["critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"]:
        assert key in metrics


def test_lora_actor_reference_is_base_and_export_merges(tiny_qwen_path, configs, batch_factory, tmp_path):
    config = configs[0](tiny_qwen_path)
    config["model"].update(lora_rank=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    worker = ActorRolloutRefWorker(config, role="actor_rollout_ref")
    worker.init_model()
    assert worker.ref_module is None  # no second model: the base with adapters off
    data = _prepared_batch(worker, batch_factory, seed=6)
    base_log_probs = data.batch["ref_log_probs"].clone()
    for _ in range(2):  # lora_B starts at 0: the first step moves only lora_B, the second changes outputs
        data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
        worker.update_actor(data)
    new_log_probs = worker.compute_log_prob(data).batch["old_log_probs"]
    assert (new_log_probs - base_log_probs).abs().max() > 1e-6
    torch.testing.assert_close(worker.compute_ref_log_prob(data).batch["ref_log_probs"], base_log_probs,
                               atol=1e-6, rtol=0)
    worker.export_hf(str(tmp_path / "merged"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    ids, mask = data.batch["input_ids"], data.batch["attention_mask"]
    with torch.no_grad():
        expected = worker.actor_module(input_ids=ids, attention_mask=mask, use_cache=False).logits
        got = loaded(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_full_params_in_the_rollout_dtype(actor_worker):
    """A weight push can gather straight into the engine's dtype (bf16 on GPU) where the shards live."""
    from verl.utils.fsdp_utils import iter_full_params

    full = _full_params(actor_worker)
    cast = dict(iter_full_params(actor_worker.actor_module, device=None, dtype=torch.bfloat16))
    assert cast.keys() == full.keys()
    for name, tensor in cast.items():
        assert tensor.dtype == torch.bfloat16 and tensor.device == full[name].device, name
        torch.testing.assert_close(tensor, full[name].to(torch.bfloat16), rtol=0, atol=0)


def test_a_plain_process_world_of_one_leaves_the_environment_alone(tmp_path):
    # a child process: the group must not outlive the check in pytest's own process
    import json
    import os
    import subprocess
    import sys

    script = ("import json, os, torch.distributed as dist; from verl.utils import fsdp_utils; "
              "fsdp_utils.init_distributed(); "
              "print(json.dumps([dist.get_world_size(), dist.get_rank(), "
              "[k for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT') if k in os.environ]]))")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         check=True)
    # the rendezvous went to torch only: a later child (a trainer run, torchrun) inherits no stale port
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [1, 0, []]
