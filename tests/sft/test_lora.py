"""LoRA: merged export reproduces the adapted model; adapters off reproduces the base model."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from verl.utils import lora


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _adapted(tiny_model_dir):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    model = lora.wrap_lora(base, lora_rank=4, lora_alpha=8, target_modules="all-linear").eval()
    torch.manual_seed(0)
    with torch.no_grad():  # lora_B starts at zero (a no-op); give the adapters a real effect
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.2)
    return model


def test_only_adapters_trainable(tiny_model_dir):
    model = _adapted(tiny_model_dir)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_merge_and_export_matches_adapted_logits(tiny_model_dir, tiny_tokenizer, tmp_path):
    ids = torch.tensor([tiny_tokenizer("<search> who wrote hamlet </search>")["input_ids"]])
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    model = _adapted(tiny_model_dir)
    adapted = _logits(model, ids)
    assert not torch.allclose(adapted, _logits(reference, ids), atol=1e-3)  # adapters matter
    out = lora.export_merged(model.state_dict(), model.base_model.model.config, tmp_path / "hf",
                             scaling=lora.lora_scaling(model), tokenizer=tiny_tokenizer)
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    torch.testing.assert_close(_logits(merged, ids), adapted, atol=1e-4, rtol=1e-4)
    # the engine-sync path (the actor worker's: merged_state_dict of the gathered state) gives the export's weights
    named = lora.merged_state_dict(model.state_dict(), lora.lora_scaling(model))
    for name, tensor in merged.state_dict().items():
        if name in named:
            torch.testing.assert_close(named[name], tensor)


def test_reference_policy_is_base_model(tiny_model_dir, tiny_tokenizer):
    ids = torch.tensor([tiny_tokenizer("<answer> Paris </answer>")["input_ids"]])
    base_logits = _logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval(), ids)
    model = _adapted(tiny_model_dir)
    with lora.reference_policy(model):
        torch.testing.assert_close(_logits(model, ids), base_logits)
    assert not torch.allclose(_logits(model, ids), base_logits, atol=1e-3)  # adapters back on


def test_merged_state_dict_errors():
    import pytest

    state = {"base_model.model.x.lora_A.default.weight": torch.zeros(2, 3)}
    with pytest.raises(ValueError, match="only lora_A"):
        lora.merged_state_dict(state, 1.0)
