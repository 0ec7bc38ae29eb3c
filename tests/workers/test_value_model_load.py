"""Loading the critic from a causal-LM checkpoint: quiet about the value head it always lacks,
loud about anything else the checkpoint lacks."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from verl.utils.fsdp_utils import load_value_model


def test_a_fresh_value_head_is_not_reported(tiny_qwen_path, caplog):
    caplog.set_level(logging.INFO)
    torch.manual_seed(0)
    load_value_model({"path": tiny_qwen_path})
    assert not [r for r in caplog.records if "LOAD REPORT" in r.getMessage()]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
    assert any("value head score newly initialised" in r.getMessage() for r in caplog.records)


def test_other_missing_weights_are_named(tiny_qwen_path, tmp_path, caplog):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_qwen_path, broken)
    state = load_file(broken / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, broken / "model.safetensors", metadata={"format": "pt"})
    caplog.set_level(logging.INFO)
    load_value_model({"path": str(broken)})
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("1 weights missing from the checkpoint" in w and "model.layers.1.mlp.up_proj.weight" in w
               for w in warnings), warnings


def test_a_fresh_value_head_starts_at_zero_and_learns(tiny_qwen_path):
    """Every token's value is 0 before the first update, whatever the token; the head's gradient is not."""
    critic = load_value_model({"path": tiny_qwen_path})
    input_ids = torch.randint(10, 1000, (3, 9))
    values = critic(input_ids=input_ids).logits[..., 0]
    assert torch.equal(values, torch.zeros_like(values))
    values.sub(torch.rand_like(values)).pow(2).mean().backward()
    assert critic.score.weight.grad.abs().sum() > 0 and critic.score.bias.grad.abs().sum() > 0


def test_a_random_value_head_gives_token_values(tiny_qwen_path):
    torch.manual_seed(0)
    critic = load_value_model({"path": tiny_qwen_path}, head_init="random")
    with torch.no_grad():
        values = critic(input_ids=torch.randint(10, 1000, (2, 7))).logits[..., 0]
    assert values.std() > 0


def test_a_value_head_in_the_checkpoint_is_loaded_not_reset(tiny_qwen_path, tmp_path):
    """A saved critic (trained head included) reloads as saved under the default ``zero``."""
    torch.manual_seed(0)
    trained = load_value_model({"path": tiny_qwen_path}, head_init="random")
    trained.save_pretrained(tmp_path / "critic")
    reloaded = load_value_model({"path": str(tmp_path / "critic")})
    torch.testing.assert_close(reloaded.score.weight, trained.score.weight)
    torch.testing.assert_close(reloaded.score.bias, trained.score.bias)


def test_an_unknown_head_init_is_named(tiny_qwen_path):
    with pytest.raises(ValueError, match=r"critic.model.value_head_init='gaussian': choose one of \['zero', 'random'\]"):
        load_value_model({"path": tiny_qwen_path}, head_init="gaussian")
