"""Fixtures for the worker tests: PPO batches shaped like the trainer's, built from real token ids."""

from __future__ import annotations

import pytest
import torch



def make_ppo_batch(num_rows: int = 6, prompt_len: int = 10, response_len: int = 8, vocab: int = 5000,
                   seed: int = 0):
    """A DataProto with left-padded prompts, right-padded responses and an observation span.

    Prompt lengths and response lengths vary per row; one row's response has an observation
    span (attention 1, response_mask 0) in the middle, as the search loop produces.
    """
    from verl.protocol import DataProto
    from verl.utils.torch_functional import position_ids_from_mask

    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(10, vocab, (num_rows, prompt_len), generator=gen)
    responses = torch.randint(10, vocab, (num_rows, response_len), generator=gen)
    prompt_mask = torch.ones(num_rows, prompt_len, dtype=torch.long)
    response_attn = torch.ones(num_rows, response_len, dtype=torch.long)
    for row in range(num_rows):
        prompt_mask[row, : int(torch.randint(0, prompt_len // 2, (1,), generator=gen))] = 0
        keep = int(torch.randint(response_len // 2, response_len + 1, (1,), generator=gen))
        response_attn[row, keep:] = 0
    prompts = prompts * prompt_mask  # pad id 0 where masked (never used to infer masks)
    responses = responses * response_attn
    response_mask = response_attn.clone()
    response_mask[0, 1:3] = 0  # an observation span: attended to but not trained on
    attention_mask = torch.cat([prompt_mask, response_attn], dim=1)
    tensors = {
        "prompts": prompts, "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "response_mask": response_mask,
        "advantages": torch.randn(num_rows, response_len, generator=gen) * response_mask,
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


@pytest.fixture(scope="session")
def batch_factory():
    """``make_ppo_batch`` as a fixture, so test modules need no import of this file."""
    return make_ppo_batch


def actor_rollout_ref_config(model_path: str, **actor_overrides) -> dict:
    """An ``actor_rollout_ref`` subtree for the tiny model: small batches, fp32, AdamW."""
    actor = dict(ppo_mini_batch_size=6, ppo_micro_batch_size_per_gpu=3, use_dynamic_bsz=False,
                 ppo_max_token_len_per_gpu=64, grad_clip=1.0, clip_ratio=0.2, clip_ratio_c=3.0,
                 entropy_coeff=0.001, loss_agg_mode="token-mean", use_kl_loss=True, kl_loss_coef=0.01,
                 kl_loss_type="low_var_kl", ppo_epochs=1, shuffle=False, tis_imp_ratio_cap=-1.0,
                 policy_loss={"loss_mode": "vanilla"},
                 optim=dict(lr=1e-3, eps=1e-3, weight_decay=0.0, lr_warmup_steps_ratio=0.0,
                            warmup_style="constant"),
                 fsdp_config=dict(param_offload=False, optimizer_offload=False, mixed_precision="bf16"))
    actor.update(actor_overrides)
    return {
        "model": {"path": model_path, "use_remove_padding": True, "enable_gradient_checkpointing": False,
                  "trust_remote_code": False},
        "actor": actor,
        "ref": {"log_prob_micro_batch_size_per_gpu": 4, "fsdp_config": {"param_offload": False}},
        "rollout": {"name": "hf", "dtype": "float32", "n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                    "log_prob_micro_batch_size_per_gpu": 4},
    }


def critic_config(model_path: str, **overrides) -> dict:
    """A complete ``critic`` subtree for the tiny model (standalone, the keys that default to the
    actor's are given)."""
    cfg = dict(ppo_mini_batch_size=6, ppo_micro_batch_size_per_gpu=3,
               forward_micro_batch_size_per_gpu=4, use_dynamic_bsz=False, ppo_max_token_len_per_gpu=64,
               ppo_epochs=1, shuffle=False, grad_clip=1.0, cliprange_value=0.5, loss_agg_mode="token-mean",
               use_torch_compile=True, optim=dict(lr=1e-3, weight_decay=0.0, warmup_style="constant"),
               model={"path": model_path, "tokenizer_path": model_path, "external_lib": None,
                      "max_packed_row_len": 0, "attn_implementation": None, "use_remove_padding": True,
                      "enable_gradient_checkpointing": True,
                      "fsdp_config": {"param_offload": False, "optimizer_offload": True}})
    cfg.update(overrides)
    return cfg


@pytest.fixture(scope="session")
def configs():
    """The two config builders, as a fixture."""
    return actor_rollout_ref_config, critic_config


@pytest.fixture(scope="module")
def ray_cpu_pool():
    """A real local Ray session with two CPU ranks (0.2 CPU each, so they fit on 2 cores)."""
    import os

    import ray

    from verl.single_controller import RayResourcePool, init_ray

    init_ray(num_cpus=2, env_vars={"PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
                                   "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                   "TOKENIZERS_PARALLELISM": "false"},
             object_store_memory=200 * 1024**2)
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=2, cpus_per_worker=0.2)
    yield pool
    pool.release()
    ray.shutdown()
