"""attn_implementation="torch_varlen": packed rows give the padded model's log-probs and gradients.

On CPU the per-sequence sdpa reference runs (same boundaries, same plumbing through transformers);
the CUDA test runs torch's varlen flash kernel in bf16 and is skipped without a GPU.
"""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from verl.utils import torch_functional as F
from verl.utils import varlen_attention
from verl.utils.fsdp_utils import resolve_attn_implementation
from verl.workers.forward import ForwardLayout, forward_log_probs


def _pair(device="cpu", dtype=torch.float32):
    """The same random Qwen2 (GQA: 4 query heads, 2 KV heads) under sdpa and torch_varlen."""
    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    varlen_attention.register()
    torch.manual_seed(0)
    # separate configs: from_config records the attention choice on the config object it is given
    sdpa = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa", dtype=dtype).to(device)
    varlen = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=varlen_attention.NAME,
                                              dtype=dtype).to(device)
    varlen.load_state_dict(sdpa.state_dict())
    return sdpa, varlen


def _batch(device="cpu"):
    """Left-padded prompts + right-padded responses of different lengths ``(4, 7 + 6)``."""
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, 128, (4, 13), generator=gen)
    attention_mask = torch.ones(4, 13, dtype=torch.long)
    attention_mask[0, :3] = 0
    attention_mask[2, :5] = 0
    attention_mask[1, 10:] = 0
    attention_mask[3, 8:] = 0
    micro = {"input_ids": input_ids, "attention_mask": attention_mask,
             "position_ids": F.position_ids_from_mask(attention_mask), "responses": input_ids[:, 7:]}
    return {k: v.to(device) for k, v in micro.items()}


def test_cu_seqlens_from_position_ids():
    cu, max_len = varlen_attention.cu_seqlens_from_position_ids(torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]))
    assert cu.tolist() == [0, 3, 5, 9, 10] and max_len == 4
    with pytest.raises(ValueError, match="start at position 0"):
        varlen_attention.cu_seqlens_from_position_ids(torch.tensor([[3, 4, 0, 1]]))


def test_packed_row_len_is_uncapped_for_varlen_only():
    sdpa, varlen = _pair()
    assert varlen_attention.packed_row_len(sdpa, 64, 1000) == 64
    assert varlen_attention.packed_row_len(varlen, 64, 1000) == 1000
    assert resolve_attn_implementation("eager") == "eager"


def _log_probs_and_grads(model, micro, use_remove_padding):
    model.zero_grad(set_to_none=True)
    layout = ForwardLayout(use_remove_padding=use_remove_padding, max_packed_row_len=16)
    log_probs, _ = forward_log_probs(model, micro, 1.0, layout)
    mask = micro["attention_mask"][:, -6:].float()
    (log_probs * mask).sum().backward()
    return log_probs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _check_same(sdpa, varlen, micro, atol, grad_rtol):
    ref_lp, ref_grads = _log_probs_and_grads(sdpa, micro, use_remove_padding=False)
    lp, grads = _log_probs_and_grads(varlen, micro, use_remove_padding=True)
    mask = micro["attention_mask"][:, -6:].bool()
    assert torch.allclose(lp[mask].float(), ref_lp[mask].float(), atol=atol), (lp - ref_lp)[mask].abs().max()
    for name, grad in grads.items():
        scale = ref_grads[name].float().abs().max().clamp(min=1e-3)
        err = (grad.float() - ref_grads[name].float()).abs().max() / scale
        assert err < grad_rtol, f"{name}: relative gradient error {err}"


def test_packed_varlen_matches_padded_sdpa_cpu():
    sdpa, varlen = _pair()
    _check_same(sdpa, varlen, _batch(), atol=1e-5, grad_rtol=5e-4)


def test_padded_batch_and_generation_fall_back_to_sdpa():
    sdpa, varlen = _pair()
    micro = _batch()
    kwargs = {k: micro[k] for k in ("input_ids", "attention_mask", "position_ids")}
    assert torch.allclose(sdpa(**kwargs).logits, varlen(**kwargs).logits, atol=1e-6)
    prompt = micro["input_ids"][1:2, :7]
    assert torch.equal(sdpa.generate(prompt, max_new_tokens=4, do_sample=False),
                       varlen.generate(prompt, max_new_tokens=4, do_sample=False))


@pytest.mark.skipif(not varlen_attention.varlen_kernel_available(), reason="needs CUDA and torch.nn.attention.varlen")
def test_packed_varlen_matches_padded_sdpa_cuda_bf16():
    sdpa, varlen = _pair("cuda", torch.bfloat16)
    _check_same(sdpa, varlen, _batch("cuda"), atol=5e-2, grad_rtol=0.1)  # bf16: was 2.5, which passed anything


def test_packed_forward_finds_the_boundaries_once_not_per_layer(monkeypatch):
    """forward_log_probs passes the boundaries with the inputs; no layer recomputes them."""
    _, varlen = _pair()
    calls = []
    original = varlen_attention.cu_seqlens_from_position_ids
    monkeypatch.setattr(varlen_attention, "cu_seqlens_from_position_ids",
                        lambda position_ids: calls.append(1) or original(position_ids))
    with torch.no_grad():
        forward_log_probs(varlen, _batch(), 1.0, ForwardLayout(use_remove_padding=True))
    assert len(calls) == 1 and varlen.config.num_hidden_layers == 2
