"""LoRA actor in RL through Ray: ref log-probs are the base model's; updates train only adapters."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.protocol import DataProto
from verl.utils.torch_functional import logprobs_from_logits, position_ids_from_mask

pytestmark = pytest.mark.slow


def lora_actor_config(model_path: str) -> dict:
    actor = dict(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False,
                 ppo_max_token_len_per_gpu=64, grad_clip=1.0, clip_ratio=0.2, clip_ratio_c=3.0,
                 entropy_coeff=0.0, loss_agg_mode="token-mean", use_kl_loss=True, kl_loss_coef=0.01,
                 kl_loss_type="low_var_kl", ppo_epochs=1, shuffle=False, tis_imp_ratio_cap=-1.0,
                 policy_loss={"loss_mode": "vanilla"},
                 optim=dict(lr=1e-2, weight_decay=0.0, lr_warmup_steps_ratio=0.0, warmup_style="constant"),
                 fsdp_config=dict(param_offload=False, optimizer_offload=False))
    return {"model": {"path": model_path, "use_remove_padding": True, "enable_gradient_checkpointing": True,
                      "lora_rank": 8, "lora_alpha": 16, "target_modules": "all-linear"},
            "actor": actor,
            "ref": {"log_prob_micro_batch_size_per_gpu": 2, "fsdp_config": {"param_offload": False}},
            "rollout": {"name": "hf", "dtype": "float32", "n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                        "log_prob_micro_batch_size_per_gpu": 2}}


def make_batch(num_rows=4, prompt_len=8, response_len=6, seed=0) -> DataProto:
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(10, 5000, (num_rows, prompt_len), generator=gen)
    responses = torch.randint(10, 5000, (num_rows, response_len), generator=gen)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[1, :3] = 0  # left padding
    response_attn = torch.ones_like(responses)
    response_attn[2, 4:] = 0  # right padding
    response_mask = response_attn.clone()
    response_mask[0, 1:3] = 0  # an observation span
    attention_mask = torch.cat([prompt_mask, response_attn], dim=1)
    return DataProto.from_dict(tensors={
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask, "position_ids": position_ids_from_mask(attention_mask),
        "response_mask": response_mask,
        "advantages": torch.randn(num_rows, response_len, generator=gen) * response_mask},
        meta_info={"temperature": 1.0})


def base_log_probs(model_path: str, data: DataProto) -> torch.Tensor:
    """(batch, response_len) log-probs of the responses under the plain HF base model."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    batch, width = data.batch, data.batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    return logprobs_from_logits(logits[:, -width - 1:-1], batch["responses"])


@pytest.fixture(scope="module")
def lora_group(tiny_model_dir):
    import ray

    from verl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    init_ray(num_cpus=2, env_vars={"PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])},
             object_store_memory=200 * 1024**2)
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=2, cpus_per_worker=0.2)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config=lora_actor_config(tiny_model_dir),
                                                      role="actor_rollout_ref"), name_prefix="lora", timeout_s=300)
    group.init_model()
    yield group
    group.shutdown()
    pool.release()
    ray.shutdown()


def test_lora_rl_step_ref_is_base(lora_group, tiny_model_dir, tmp_path):
    data = make_batch()
    valid = data.batch["response_mask"].bool()
    expected = base_log_probs(tiny_model_dir, data)
    ref = lora_group.compute_ref_log_prob(data).batch["ref_log_probs"]
    torch.testing.assert_close(ref[valid], expected[valid], atol=1e-4, rtol=1e-4)

    data.batch["ref_log_probs"] = ref
    data.batch["old_log_probs"] = lora_group.compute_log_prob(data).batch["old_log_probs"]
    for _ in range(2):
        metrics = lora_group.update_actor(data).meta_info["metrics"]
    assert "actor/pg_loss" in metrics
    after = lora_group.compute_log_prob(data).batch["old_log_probs"]
    assert (after[valid] - expected[valid]).abs().max() > 1e-3  # the adapters learned something
    # the reference is still the untouched base: no second copy, adapters disabled
    ref_after = lora_group.compute_ref_log_prob(data).batch["ref_log_probs"]
    torch.testing.assert_close(ref_after[valid], expected[valid], atol=1e-4, rtol=1e-4)
    # the merged export is the adapted policy
    lora_group.export_hf(str(tmp_path / "hf"))
    exported = base_log_probs(str(tmp_path / "hf"), data)
    torch.testing.assert_close(exported[valid], after[valid], atol=1e-4, rtol=1e-4)
