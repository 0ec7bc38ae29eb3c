"""Loading the critic from a causal-LM checkpoint: quiet about the value head it always lacks,
loud about anything else the checkpoint lacks."""

from __future__ import annotations

import logging
import shutil

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
