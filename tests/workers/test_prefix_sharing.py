"""Shared-prompt packing and the on-policy update: same numbers as the plain layouts, less compute."""

from __future__ import annotations

import copy

import pytest
import torch
from verl.trainer.ppo.config import load_config
from verl.trainer.ppo.config_check import on_policy_update, rollout_log_probs
from verl.utils.fsdp_utils import load_causal_lm
from verl.utils.prefix_sharing import pack_shared_prompts, supports_custom_mask
from verl.workers.forward import ForwardLayout

from .test_dp_actor import _updated_params, log_probs_of, make_actor, reference_log_probs


@pytest.fixture(scope="module")
def model(tiny_qwen_path):
    torch.manual_seed(0)
    model = load_causal_lm({"path": tiny_qwen_path})
    assert supports_custom_mask(model), "the tiny model must use sdpa/eager for these tests to mean anything"
    return model


def grouped_batch(batch_factory, group_sizes=(3, 2, 1, 2), seed=11):
    """Rows in groups sharing one prompt (as after ``rollout.n`` repeats), responses all different."""
    data = batch_factory(num_rows=sum(group_sizes), seed=seed)
    batch, prompt_len = data.batch, data.batch["prompts"].shape[1]
    row = 0
    for size in group_sizes:
        for member in range(row + 1, row + size):
            for key in ("prompts", "input_ids", "attention_mask"):
                batch[key][member, :prompt_len] = batch[key][row, :prompt_len]
        row += size
    from verl.utils.torch_functional import position_ids_from_mask

    batch["position_ids"] = position_ids_from_mask(batch["attention_mask"])
    return data


SHARED = dict(use_remove_padding=True, share_prompts=True)


def test_each_prompt_packed_once_and_siblings_masked(batch_factory):
    data = grouped_batch(batch_factory)
    b = data.batch
    prompt_len = b["prompts"].shape[1]
    ids, pos, src, dst, mask = pack_shared_prompts(b["input_ids"], b["attention_mask"], b["position_ids"],
                                                   prompt_len, max_row_len=1000)
    prompt_tokens = [int(b["attention_mask"][r, :prompt_len].sum()) for r in (0, 3, 5, 6)]
    response_tokens = int(b["attention_mask"][:, prompt_len:].sum())
    assert int(torch.unique(dst).numel()) == sum(prompt_tokens) + response_tokens
    assert src.numel() == int(b["attention_mask"].sum())  # every valid token has a slot
    assert torch.equal(ids.reshape(-1)[dst], b["input_ids"].reshape(-1)[src])
    assert torch.equal(pos.reshape(-1)[dst], b["position_ids"].reshape(-1)[src])
    flat_mask = mask[0, 0]
    # Row 1's first response token must see row 0's prompt (shared) but not row 0's response.
    seqlen = b["input_ids"].shape[1]
    slot = {int(s): int(d) for s, d in zip(src, dst)}
    first_resp_1 = slot[1 * seqlen + prompt_len]
    first_resp_0 = slot[0 * seqlen + prompt_len]
    last_prompt = slot[0 * seqlen + prompt_len - 1]
    assert slot[1 * seqlen + prompt_len - 1] == last_prompt
    assert flat_mask[first_resp_1, last_prompt] and not flat_mask[first_resp_1, first_resp_0]


@pytest.mark.parametrize("max_row_len", [0, 24])  # 24: groups split, each part repeats the prompt
def test_shared_log_probs_equal_plain_forward(model, batch_factory, max_row_len):
    data = grouped_batch(batch_factory)
    plain = dict(ppo_micro_batch_size_per_gpu=8, ppo_mini_batch_size=8)
    actor = make_actor(model, max_packed_row_len=max_row_len, **SHARED, **plain)
    log_probs, entropy = log_probs_of(actor, data, calculate_entropy=True)
    torch.testing.assert_close(log_probs, reference_log_probs(model, data), atol=1e-5, rtol=0)
    _, plain_entropy = log_probs_of(make_actor(model, **plain), data, calculate_entropy=True)
    torch.testing.assert_close(entropy, plain_entropy, atol=1e-5, rtol=0)


def test_shared_update_equals_padded_update(model, batch_factory):
    data = grouped_batch(batch_factory)
    old, _ = log_probs_of(make_actor(model), data)
    data.batch["old_log_probs"] = old + 0.2 * torch.randn(old.shape, generator=torch.Generator().manual_seed(2))
    common = dict(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=4, entropy_coeff=0.01, grad_clip=0.0)
    padded, _ = _updated_params(model, data, **common)
    shared, _ = _updated_params(model, data, **SHARED, **common)
    assert any(not torch.equal(padded[k], v) for k, v in model.named_parameters())
    for name in padded:
        torch.testing.assert_close(shared[name], padded[name], atol=1e-6, rtol=1e-5, msg=name)


def test_on_policy_update_needs_no_old_log_probs(model, batch_factory):
    data = grouped_batch(batch_factory)
    common = dict(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=4, grad_clip=0.0)
    with_old = copy.deepcopy(data)
    with_old.batch["old_log_probs"], _ = log_probs_of(make_actor(model), data)
    expected, expected_metrics = _updated_params(model, with_old, **common)
    got, metrics = _updated_params(model, data, **common)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)
    assert metrics["actor/pg_loss"] == pytest.approx(expected_metrics["actor/pg_loss"], abs=1e-6)
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0
    with pytest.raises(KeyError, match="old_log_probs"):  # two mini-batches: the second is off-policy
        _updated_params(model, data, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4)


@pytest.mark.parametrize("override, expected", [
    ({}, True),
    ({"actor_rollout_ref.actor.ppo_epochs": 2}, False),
    ({"actor_rollout_ref.actor.ppo_mini_batch_size": 4}, False),
    ({"algorithm.use_kl_in_reward": True}, False),
    ({"actor_rollout_ref.actor.tis_imp_ratio_cap": 2.0}, False),
    ({"actor_rollout_ref.actor.skip_old_log_prob_on_policy": False}, False),
])
def test_on_policy_update_detection(override, expected):
    assert on_policy_update(small_config(override)) is expected


@pytest.mark.parametrize("override, expected", [
    ({}, False),
    ({"actor_rollout_ref.actor.tis_imp_ratio_cap": 2.0}, True),
    ({"actor_rollout_ref.rollout.calculate_log_probs": True}, True),
])
def test_rollout_log_probs_only_where_something_reads_them(override, expected):
    assert rollout_log_probs(small_config(override)) is expected


def small_config(override: dict):
    """A checked config of 8 prompts a step with ``override`` (dotted keys) applied."""
    tree = {"data": {"train_batch_size": 8}, "trainer": {"n_gpus_per_node": 1},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 8, "ppo_micro_batch_size": 4}},
            "critic": {"ppo_micro_batch_size": 4}, "algorithm": {"use_kl_in_reward": False}}
    for key, value in override.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return load_config(tree)


def test_layout_keeps_share_prompts_only_where_the_attention_takes_a_mask(model, caplog):
    from verl.utils.model_config import ModelConfig

    config = ModelConfig(path="unused", share_prompts=True, use_remove_padding=True)
    assert ForwardLayout.for_model(config, model).share_prompts
    model.config._attn_implementation = "flash_attention_2"
    try:
        with caplog.at_level("WARNING", logger="verl.workers.forward"):
            assert not ForwardLayout.for_model(config, model).share_prompts
        assert "share_prompts is off" in caplog.text
    finally:
        model.config._attn_implementation = "sdpa"
