"""The step-speed benchmark (benchmarks/learning_step_speed.py): its variants are valid recipes that
differ only in speed settings, its summaries are right, and on CPU it measures a real short run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("SEARCH_R1_SHARED_DATA", ROOT.parent / "shared" / "data"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import learning_step_speed as bench  # noqa: E402

from verl.trainer.main_ppo import parse_config  # noqa: E402

# What a variant may change: nothing of the loss, the data, the batch or the sampling distribution.
SPEED_KEYS = {"actor_rollout_ref.rollout.free_cache_engine", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
              "actor_rollout_ref.rollout.seed_per_request", "actor_rollout_ref.actor.use_torch_compile"}


@pytest.mark.parametrize("name", sorted(bench.VARIANTS))
def test_variants_are_the_learning_recipe_with_speed_settings_only(name, tmp_path):
    cfg = parse_config(["algorithm.adv_estimator=grpo", "trainer.n_gpus_per_node=1",
                        *bench.variant_overrides(name, 4, tmp_path)])
    assert cfg.trainer.total_training_steps == 4 and cfg.trainer.save_freq == -1
    assert cfg.data.train_batch_size == 64 and cfg.actor_rollout_ref.rollout.n == 8 and cfg.max_turns == 2
    assert {o.split("=")[0] for o in bench.VARIANTS[name]["overrides"]} <= SPEED_KEYS


def test_repeats_run_their_variant_under_their_own_name(tmp_path):
    assert bench.base_name("after@2") == "after" and bench.base_name("after") == "after"
    assert bench.variant_overrides("after@2", 3, tmp_path) == bench.variant_overrides("after", 3, tmp_path)


def test_summaries_medians_ratios_and_hottest_frames(tmp_path):
    rows = [{"timing_s/step": s, "timing_s/gen": g} for s, g in ((10.0, 5.0), (12.0, 6.0), (14.0, 9.0))]
    assert bench.medians(rows)["step"] == {"median": 12.0, "min": 10.0, "max": 14.0, "n": 3}
    variants = {"before": {"median": {"step": {"median": 12.0}}}, "after": {"median": {"step": {"median": 6.0}}},
                "failed": {}}
    assert bench.ratios(variants) == {"after": 2.0}
    stacks = tmp_path / "stacks.txt"
    stacks.write_text("main;step;decode 30\nmain;step;detokenize 10\nmain;idle 60\n")
    hot = bench.hottest(stacks, top=3)
    assert hot["samples"] == 100 and hot["self"] == [["idle", 0.6], ["decode", 0.3], ["detokenize", 0.1]]
    assert ["main", 1.0] in hot["inclusive"] and ["step", 0.4] in hot["inclusive"]


def test_a_variant_of_another_commit_runs_that_commit_s_tree(tmp_path, monkeypatch):
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode:
        pytest.skip("not a git checkout")
    monkeypatch.setitem(bench.VARIANTS, "old", {"tree": head.stdout.strip(), "overrides": []})
    tree = bench.variant_tree("old", tmp_path)
    assert (tree / "train_grpo.sh").read_bytes() == subprocess.run(
        ["git", "show", "HEAD:train_grpo.sh"], cwd=ROOT, capture_output=True).stdout
    assert bench.variant_tree("after", tmp_path) == ROOT
    monkeypatch.setitem(bench.VARIANTS, "missing", {"tree": "0000000", "overrides": []})
    with pytest.raises(FileNotFoundError, match="variant missing"):
        bench.variant_tree("missing", tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "qa").is_dir(), reason=f"shared data not found at {SHARED}")
def test_cpu_run_reports_per_phase_medians(tmp_path, tiny_qwen_path):
    import learning_data

    learning_data.build(SHARED, tmp_path / "data", seed=19)
    out = tmp_path / "out"
    assert bench.main(["--profile", "cpu", "--variants", "after", "--steps", "2", "--model", tiny_qwen_path,
                       "--work_dir", str(tmp_path / "work"), "--out_dir", str(out), "--data",
                       str(tmp_path / "data")]) == 0
    report = json.loads((out / "learning_step_speed.json").read_text())
    after = report["variants"]["after"]
    assert after["returncode"] == 0 and after["steps_logged"] == 2 and after["tree"] == "this commit"
    assert [row["step"] for row in after["steps"]] == [1, 2]
    for phase in ("gen", "gen_engine", "update_actor", "weight_sync", "step"):
        assert after["median"][phase]["n"] == 1 and after["median"][phase]["median"] >= 0, phase
    assert after["steps"][1]["num_micro_batches"] >= 1 and after["host_probe_ms"] > 0
    assert after["steps"][1]["engine_calls"] >= 1 and after["steps"][1]["decode_steps"] >= 1
    assert report["meta"]["commit"] and report["meta"]["steps_per_variant"] == 2
