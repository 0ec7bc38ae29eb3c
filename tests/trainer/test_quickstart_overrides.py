"""scripts/quickstart.py (behind train_*.sh): the user's overrides win over the script's defaults."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import quickstart  # noqa: E402


def test_the_last_override_of_a_key_wins():
    overrides = ["retriever.url=http://a/retrieve", "trainer.total_epochs=1", "+retriever.url=http://b/retrieve"]
    assert quickstart.override_value(overrides, "retriever.url") == "http://b/retrieve"
    assert quickstart.override_value(overrides, "trainer.default_local_dir") is None


def test_warm_start_leaves_a_model_the_user_chose(monkeypatch, tmp_path, capsys):
    """train_*.sh pass BASE_MODEL as model.path and the user's overrides after it; with WARM_START=1
    (the CPU default) a model other than SmolLM2 is trained as given, not replaced by the warm start."""
    monkeypatch.setenv("WARM_START", "1")
    overrides = ["actor_rollout_ref.model.path=/shipped/smollm2", f"actor_rollout_ref.model.path={tmp_path}"]
    assert quickstart.choose_model(overrides) == overrides
    assert f"warm start: skipped, the run trains {tmp_path}" in capsys.readouterr().out
    monkeypatch.setenv("WARM_START", "0")
    assert quickstart.choose_model(overrides) == overrides


def test_without_a_model_the_embedded_default_is_smollm2(monkeypatch, smollm2_path):
    """train_*.sh name a model only when BASE_MODEL is set (so nothing is converted before the
    configuration is checked); without one the run trains SmolLM2 (warm-started with WARM_START=1)."""
    monkeypatch.setenv("WARM_START", "0")
    assert quickstart.choose_model(["x=1"]) == ["x=1", f"actor_rollout_ref.model.path={smollm2_path}"]
