"""DataParallelPPOActor on a real (tiny, random-init) Qwen2 model, without FSDP (world size 1)."""

from __future__ import annotations

import copy

import pytest
import torch
from verl.trainer.ppo.health import positive_logprob
from verl.utils.config import to_typed
from verl.utils.fsdp_utils import load_causal_lm
from verl.workers.actor.config import ActorConfig
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.batching import actor_update_batching
from verl.workers.forward import ForwardLayout


@pytest.fixture(scope="module")
def model(tiny_qwen_path):
    torch.manual_seed(0)
    return load_causal_lm({"path": tiny_qwen_path})


def actor_config(**overrides):
    base = dict(ppo_mini_batch_size=6, ppo_micro_batch_size_per_gpu=6, use_dynamic_bsz=False,
                ppo_max_token_len_per_gpu=40, ppo_epochs=1, grad_clip=1.0, clip_ratio=0.2,
                entropy_coeff=0.0, loss_agg_mode="token-mean", use_kl_loss=False, kl_loss_coef=0.01,
                kl_loss_type="low_var_kl", tis_imp_ratio_cap=0.0, policy_loss={"loss_mode": "vanilla"})
    base.update(overrides)
    return to_typed(ActorConfig, base)


def make_actor(model, optimizer=None, use_remove_padding=False, share_prompts=False, max_packed_row_len=0,
               **overrides):
    """An actor on one rank: its config, forward layout and update batching as the worker builds them."""
    config = actor_config(**overrides)
    layout = ForwardLayout(use_remove_padding=use_remove_padding, share_prompts=share_prompts,
                           max_packed_row_len=max_packed_row_len)
    return DataParallelPPOActor(config, model, optimizer, layout=layout,
                                update=actor_update_batching(config, rollout_n=1, world_size=1))


def log_probs_of(actor, data, calculate_entropy=False):
    """``compute_log_prob`` with the actor's own micro-batching, temperature 1."""
    return actor.compute_log_prob(data, actor.update.micro, 1.0, calculate_entropy)


def reference_log_probs(model, data):
    """Each row alone, padding stripped: log_softmax(model(ids).logits) at the next tokens."""
    batch = data.batch
    response_len = batch["responses"].shape[1]
    prompt_len = batch["input_ids"].shape[1] - response_len
    out = torch.zeros(len(data), response_len)
    with torch.no_grad():
        for row in range(len(data)):
            mask = batch["attention_mask"][row].bool()
            ids = batch["input_ids"][row][mask]
            logp = torch.log_softmax(model(ids[None]).logits[0].float(), -1)
            token_logp = logp[:-1].gather(-1, ids[1:, None]).squeeze(-1)  # position t predicts t+1
            num_prompt = int(mask[:prompt_len].sum())
            num_resp = int(mask[prompt_len:].sum())
            out[row, :num_resp] = token_logp[num_prompt - 1: num_prompt - 1 + num_resp]
    return out


def test_compute_log_prob_matches_plain_forward(model, batch_factory):
    data = batch_factory()
    log_probs, entropy = log_probs_of(make_actor(model, ppo_micro_batch_size_per_gpu=4, ppo_mini_batch_size=4),
                                      data, calculate_entropy=True)
    expected = reference_log_probs(model, data)
    assert log_probs.shape == data.batch["responses"].shape
    torch.testing.assert_close(log_probs, expected, atol=1e-5, rtol=0)
    valid = data.batch["attention_mask"][:, -log_probs.shape[1]:].bool()
    assert (entropy[valid] > 0).all() and (entropy[~valid] == 0).all()


def test_remove_padding_equals_padded(model, batch_factory):
    data = batch_factory(num_rows=5, seed=3)
    padded, ent_padded = log_probs_of(make_actor(model), data, True)
    packed, ent_packed = log_probs_of(make_actor(model, use_remove_padding=True), data, True)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_packed, ent_padded, atol=1e-5, rtol=0)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_dynamic_bsz_equals_fixed_micro_batches(model, batch_factory, remove_padding):
    data = batch_factory(num_rows=7, seed=5)
    fixed, _ = log_probs_of(make_actor(model, use_remove_padding=remove_padding, ppo_micro_batch_size_per_gpu=2), data)
    dynamic, _ = log_probs_of(make_actor(model, use_remove_padding=remove_padding, use_dynamic_bsz=True,
                                         ppo_max_token_len_per_gpu=30), data)
    torch.testing.assert_close(dynamic, fixed, atol=1e-5, rtol=0)


def _updated_params(model, data, **overrides):
    """Parameters after one update_policy with SGD (linear in the gradient, so equality is exact)."""
    clone = copy.deepcopy(model)
    actor = make_actor(clone, torch.optim.SGD(clone.parameters(), lr=1.0), **overrides)
    metrics = actor.update_policy(data, 1.0)
    return {k: v.detach().clone() for k, v in clone.named_parameters()}, metrics


def _with_old_log_probs(model, data):
    old, _ = log_probs_of(make_actor(model), data)
    gen = torch.Generator().manual_seed(1)
    # perturbed "old" policy so ratios differ from 1 and clipping is exercised
    data.batch["old_log_probs"] = old + 0.3 * torch.randn(old.shape, generator=gen) * data.batch["response_mask"]
    data.batch["ref_log_probs"] = old + 0.1 * torch.randn(old.shape, generator=gen)
    data.batch["rollout_log_probs"] = old + 0.2 * torch.randn(old.shape, generator=gen)
    return data


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_grad_accumulation_equals_full_batch(model, batch_factory, loss_agg_mode):
    data = _with_old_log_probs(model, batch_factory(num_rows=6, seed=7))
    common = dict(loss_agg_mode=loss_agg_mode, grad_clip=0.0, entropy_coeff=0.01, use_kl_loss=True,
                  tis_imp_ratio_cap=2.0)
    full, full_metrics = _updated_params(model, data, ppo_micro_batch_size_per_gpu=6, **common)
    accum, accum_metrics = _updated_params(model, data, ppo_micro_batch_size_per_gpu=3, **common)
    dynamic, _ = _updated_params(model, data, use_remove_padding=True, use_dynamic_bsz=True,
                                 ppo_max_token_len_per_gpu=40, **common)
    original = dict(model.named_parameters())
    assert any(not torch.equal(full[k], original[k]) for k in full), "the update changed nothing"
    for name in full:
        torch.testing.assert_close(accum[name], full[name], atol=1e-6, rtol=1e-5, msg=name)
        torch.testing.assert_close(dynamic[name], full[name], atol=1e-6, rtol=1e-5, msg=name)
    assert accum_metrics["actor/pg_loss"] == pytest.approx(full_metrics["actor/pg_loss"], abs=1e-6)
    assert accum_metrics["actor/grad_norm"] == pytest.approx(full_metrics["actor/grad_norm"], rel=1e-5)
    for key in ["actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/kl_loss", "actor/grad_norm"]:
        assert key in full_metrics


def test_nonfinite_grad_skips_step(model, batch_factory):
    data = _with_old_log_probs(model, batch_factory(num_rows=4, seed=9))
    data.batch["advantages"][0, 0] = float("nan")
    data.batch["response_mask"][0, 0] = 1
    clone = copy.deepcopy(model)
    before = {k: v.detach().clone() for k, v in clone.named_parameters()}
    actor = make_actor(clone, torch.optim.SGD(clone.parameters(), lr=1.0), ppo_mini_batch_size=4,
                       ppo_micro_batch_size_per_gpu=4)
    metrics = actor.update_policy(data, 1.0)
    assert metrics["actor/grad_norm_nonfinite"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in clone.named_parameters())


def test_llds_term_joins_the_actor_loss(model, batch_factory):
    """With ``llds.coef`` the update changes (the LLDS term's gradient) and reports the term; micro-
    batching still equals one pass over the mini-batch."""
    data = _with_old_log_probs(model, batch_factory(num_rows=6, seed=7))
    common = dict(grad_clip=0.0, llds={"coef": 0.5, "gate": "action"})
    full, metrics = _updated_params(model, data, ppo_micro_batch_size_per_gpu=6, **common)
    accum, accum_metrics = _updated_params(model, data, ppo_micro_batch_size_per_gpu=3, **common)
    plain, plain_metrics = _updated_params(model, data, ppo_micro_batch_size_per_gpu=6, grad_clip=0.0)
    assert metrics["actor/llds_loss"] > 0 and 0 < metrics["actor/llds_active_tokens"] < 1
    assert "actor/llds_loss" not in plain_metrics
    assert any(not torch.equal(full[k], plain[k]) for k in full), "the LLDS term changed nothing"
    for name in full:
        torch.testing.assert_close(accum[name], full[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("micro_rows", [6, 2])
def test_update_reports_the_positive_rows_log_prob_of_the_sampling_policy(model, batch_factory, micro_rows):
    """On-policy (no ``old_log_probs``) the update's own first forward is the sampling policy: its
    sums give the health monitor's ``lld/pos_logprob`` exactly, whatever the micro-batching."""
    data = batch_factory(num_rows=6, seed=11)
    mask = data.batch["response_mask"].float()
    data.batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0, -0.5])[:, None] * mask
    data.batch.pop("old_log_probs", None)
    expected_rows = reference_log_probs(model, data)
    row_means = (expected_rows * mask).sum(-1) / mask.sum(-1)
    expected = float(row_means[[0, 2, 4]].mean())
    _, metrics = _updated_params(model, data, ppo_micro_batch_size_per_gpu=micro_rows)
    assert metrics["actor/pos_logprob_rows"] == 3.0
    assert positive_logprob(metrics) == pytest.approx(expected, abs=1e-5)
