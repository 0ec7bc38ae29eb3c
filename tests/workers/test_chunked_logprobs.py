"""The fast log-prob paths equal the plain ones: chunked LM head and multi-row packing (CPU, fp32)."""

from __future__ import annotations

import pytest
import torch

from verl.utils import torch_functional as F
from verl.utils.fsdp_utils import load_causal_lm
from verl.workers.forward import ForwardLayout, forward_log_probs, forward_values


@pytest.fixture(scope="module")
def model(tiny_qwen_path):
    torch.manual_seed(0)
    return load_causal_lm({"path": tiny_qwen_path})


@pytest.mark.parametrize("calculate_entropy", [False, True])
def test_chunked_stats_equal_full_logits(calculate_entropy):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=gen, requires_grad=True)
    weight = torch.randn(300, 16, generator=gen, requires_grad=True)
    labels = torch.randint(0, 300, (37,), generator=gen)
    logits = (hidden @ weight.T) / 0.7
    want_lp = F.logprobs_from_logits(logits, labels)
    want_ent = F.entropy_from_logits(logits)
    lp, ent = F.chunked_logprobs_entropy(hidden, weight, labels, temperature=0.7, chunk_size=8,
                                         calculate_entropy=calculate_entropy)
    torch.testing.assert_close(lp, want_lp, atol=1e-5, rtol=0)
    want_loss, loss = want_lp.sum(), lp.sum()
    if calculate_entropy:
        torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=0)
        want_loss, loss = want_loss + want_ent.sum(), loss + ent.sum()
    else:
        assert ent is None
    want_grads = torch.autograd.grad(want_loss, (hidden, weight))
    grads = torch.autograd.grad(loss, (hidden, weight))
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_chunked_stats_reject_bad_shapes():
    with pytest.raises(ValueError, match="disagree"):
        F.chunked_logprobs_entropy(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long))


def test_pack_rows_respects_budget_and_round_trips(batch_factory):
    batch = batch_factory(num_rows=7, seed=11).batch
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    packed_ids, packed_pos, src, dst = F.pack_sequences_rows(ids, mask, pos, max_row_len=20, row_multiple=8)
    longest = int(mask.sum(-1).max())
    assert packed_ids.shape[1] <= max(20, longest) + 7 and packed_ids.shape[1] % 8 == 0 and packed_ids.shape[0] > 1
    assert torch.equal(packed_ids.reshape(-1)[dst], ids.reshape(-1)[src])
    assert torch.equal(packed_pos.reshape(-1)[dst], pos.reshape(-1)[src])
    assert sorted(src.tolist()) == torch.nonzero(mask.reshape(-1)).squeeze(-1).tolist()
    # filler slots start a new sequence (position 0) right after the last real token of a row
    filler = torch.ones(packed_ids.numel(), dtype=torch.bool)
    filler[dst] = False
    for row in filler.view(packed_ids.shape).nonzero():
        r, c = row.tolist()
        if c == 0 or not filler.view(packed_ids.shape)[r, c - 1]:
            assert packed_pos[r, c] == 0


@pytest.mark.parametrize("remove_padding,max_row_len", [(False, 0), (True, 0), (True, 20)])
def test_forward_log_probs_fast_paths_equal_full_logits(model, batch_factory, remove_padding, max_row_len):
    micro = batch_factory(num_rows=6, seed=4).batch
    results = []
    for chunk in (0, 5):  # 0: full (B, T, V) logits, the reference
        model.zero_grad(set_to_none=True)
        layout = ForwardLayout(use_remove_padding=remove_padding, logits_chunk_size=chunk,
                               max_packed_row_len=max_row_len if chunk else 0)
        lp, ent = forward_log_probs(model, micro, 0.8, layout, calculate_entropy=True)
        (lp.sum() + 0.5 * ent.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((lp.detach(), ent.detach(), grads))
    (ref_lp, ref_ent, ref_grads), (lp, ent, grads) = results
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    assert grads.keys() == ref_grads.keys()
    for name, ref in ref_grads.items():
        torch.testing.assert_close(grads[name], ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-4, msg=name)
    model.zero_grad(set_to_none=True)


def test_chunked_path_under_fsdp2_equals_full_logits(model, batch_factory):
    """FSDP2 (gloo, world of one, root resharded after forward): same log-probs and gradients."""
    import copy

    from verl.utils.fsdp_utils import apply_fsdp2

    micro = batch_factory(num_rows=5, seed=8).batch
    results = []
    for chunk in (0, 4):
        sharded = apply_fsdp2(copy.deepcopy(model), reshard_after_forward=True)
        layout = ForwardLayout(use_remove_padding=True, logits_chunk_size=chunk, max_packed_row_len=16)
        lp, ent = forward_log_probs(sharded, micro, 1.0, layout, calculate_entropy=True)
        (lp.sum() - ent.sum()).backward()
        grads = {n: p.grad.full_tensor() for n, p in sharded.named_parameters()}
        results.append((lp.detach(), grads))
    (ref_lp, ref_grads), (lp, grads) = results
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    for name, ref in ref_grads.items():
        torch.testing.assert_close(grads[name], ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-4, msg=name)


def test_critic_packed_rows_equal_padded(tiny_qwen_path, batch_factory):
    from verl.utils.fsdp_utils import load_value_model

    torch.manual_seed(0)
    critic = load_value_model({"path": tiny_qwen_path}, head_init="random")
    micro = batch_factory(num_rows=6, seed=2).batch
    with torch.no_grad():
        padded = forward_values(critic, micro, ForwardLayout(use_remove_padding=False))
        rows = forward_values(critic, micro, ForwardLayout(use_remove_padding=True, max_packed_row_len=16))
    assert padded.abs().sum() > 0
    torch.testing.assert_close(rows, padded, atol=1e-5, rtol=0)
