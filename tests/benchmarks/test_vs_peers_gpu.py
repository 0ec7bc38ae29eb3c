"""benchmarks/vs_peers_gpu.py (issue 27): each system's command is a configuration that system accepts,
the peers' reward scores as ours, each system's per-step records summarise into the right medians and
ratios, and each child sees only its own site. The veRL and TRL checks read the wheels that
benchmarks/device/peer_wheels.sh downloads into .whl-peers/ (not in a clean clone: they skip there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

import em_reward  # noqa: E402
import trl_gpu_run  # noqa: E402
import vs_peers_gpu as bench  # noqa: E402

from search_r1.envs.search_r1.reward import compute_score_em  # noqa: E402
from verl.trainer.main_ppo import parse_config  # noqa: E402

VERL_WHEEL = ROOT / ".whl-peers" / "verl" / "verl-0.9.1-py3-none-any.whl"
TRL_WHEEL = ROOT / ".whl-peers" / "trl" / "trl-1.16.0-py3-none-any.whl"
NO_WHEEL = "not in .whl-peers/ (bash benchmarks/device/peer_wheels.sh downloads it; a clean clone has none)"
INPUTS = bench.Inputs("/models/policy", Path("/data/vs_peers"), Path("/data/vs_peers/trl_questions.jsonl"))


@pytest.mark.parametrize("name", sorted(bench.CONFIGS))
def test_our_command_passes_our_config_check_single_turn(name, tmp_path):
    cfg = bench.CONFIGS[name]
    cmd = bench.ours_command(cfg, INPUTS, 5, tmp_path, name)
    assert cmd[1].endswith("scripts/quickstart.py") and "--no-retriever" in cmd
    config = parse_config(cmd[cmd.index("+recipe=search_r1_grpo"):])
    assert config.max_turns == 0 and config.do_search is False
    assert config.data.train_batch_size == cfg.prompts == config.actor_rollout_ref.actor.ppo_mini_batch_size
    assert config.actor_rollout_ref.rollout.n == cfg.n and config.data.max_response_length == cfg.max_response_length
    assert config.actor_rollout_ref.model.enable_gradient_checkpointing == cfg.gradient_checkpointing
    assert config.actor_rollout_ref.actor.use_kl_loss and config.actor_rollout_ref.actor.kl_loss_coef == 0.001
    assert config.trainer.total_training_steps == 5 and config.reward_model.style == "em"


@pytest.fixture(scope="module")
def verl_config_dir(tmp_path_factory) -> Path:
    """veRL 0.9.1's own Hydra tree (verl/trainer/config/**.yaml), unpacked from its wheel."""
    if not VERL_WHEEL.exists():
        pytest.skip(f"{VERL_WHEEL.name} {NO_WHEEL}")
    out = tmp_path_factory.mktemp("verl091")
    with zipfile.ZipFile(VERL_WHEEL) as wheel:
        wheel.extractall(out, [n for n in wheel.namelist() if n.startswith("verl/trainer/config/") and n.endswith(".yaml")])
    return out / "verl" / "trainer" / "config"


def compose_verl(config_dir: Path, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose("ppo_trainer", overrides)
    OmegaConf.resolve(config)
    return config


@pytest.mark.parametrize("name", sorted(bench.CONFIGS))
@pytest.mark.parametrize("trainer", ["v1", "v0"])
def test_verl_overrides_compose_strictly_in_verl_091s_config(verl_config_dir, name, trainer, tmp_path):
    cfg = bench.CONFIGS[name]
    config = compose_verl(verl_config_dir, bench.verl_overrides(cfg, INPUTS, 5, tmp_path, name, trainer))
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert config.data.train_batch_size == cfg.prompts == actor.ppo_mini_batch_size and rollout.n == cfg.n
    assert rollout.response_length == cfg.max_response_length and rollout.gpu_memory_utilization == cfg.gpu_memory_utilization
    assert actor.use_remove_padding and actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu == cfg.max_token_len
    assert rollout.log_prob_max_token_len_per_gpu == cfg.max_token_len and rollout.mode == "async"
    assert config.actor_rollout_ref.hybrid_engine and config.trainer.use_v1 == (trainer == "v1")
    assert Path(config.reward.custom_reward_function.path) == ROOT / "benchmarks" / "peers" / "em_reward.py"
    assert list(config.trainer.logger) == ["console", "file"]


def test_a_misspelt_verl_key_is_refused(verl_config_dir, tmp_path):
    from hydra.errors import ConfigCompositionException

    overrides = bench.verl_overrides(bench.CONFIGS["learning"], INPUTS, 5, tmp_path, "learning")
    with pytest.raises(ConfigCompositionException, match="ppo_max_tokens_len_per_gpu"):
        compose_verl(verl_config_dir, [*overrides, "actor_rollout_ref.actor.ppo_max_tokens_len_per_gpu=1"])


CASES = [
    ("<think>x</think><answer> Paris </answer>", ["Paris"]),
    ("<answer>the Eiffel Tower.</answer>", {"target": np.array(["Eiffel tower"], dtype=object)}),
    ("<answer>A</answer>", ["a"]),
    ("<answer></answer>", ["a"]),
    ("<answer>London</answer> then <answer>Paris</answer>", ["Paris"]),
    ("<answer>London</answer>", ["Paris", "paris france"]),
    ("no answer here", ["Paris"]),
    ("<information><answer>Paris</answer></information>", ["Paris"]),
    ("<answer>Rome</answer><information>Doc 1 <answer>Paris</answer>", ["Paris"]),
    ("<search>q</search>" + em_reward._INVALID_ACTION_MESSAGE + "<answer>1,000</answer>", ["1000"]),
    ("<answer>Beijing</answer>", "Beijing"),
]


@pytest.mark.parametrize("text,gold", CASES)
def test_the_peers_reward_scores_as_ours(text, gold):
    assert em_reward.compute_score("nq", text, gold) == compute_score_em(text, gold)
    assert em_reward.compute_score_em(text, gold, format_score=0.1) == compute_score_em(text, gold, format_score=0.1)
    target = gold["target"] if isinstance(gold, dict) else gold
    assert em_reward.em_reward([[{"role": "assistant", "content": text}]], [target]) == [compute_score_em(text, gold)]


def test_each_systems_records_summarise_into_medians_and_ratios(tmp_path):
    cfg = bench.CONFIGS["learning"]
    # ours: verl/utils/tracking.py JsonlLogger.log writes {"step": N, <metric>: value, ...} a line
    ours = tmp_path / "metrics.jsonl"
    ours.write_text("".join(json.dumps({"step": i + 1, "timing_s/step": s, "timing_s/gen": s / 2, "timing_s/ref": 1.0,
                                        "timing_s/update_actor": 2.0, "timing_s/weight_sync": 0.1,
                                        "response_length/mean": 100.0, "perf/total_num_tokens": 1000.0 * s,
                                        "perf/max_memory_allocated_gb/update_actor": 20.0 + i}) + "\n"
                            for i, s in enumerate((60.0, 6.0, 8.0, 7.0))))
    # veRL 0.9.1: verl/utils/tracking.py FileLogger.log writes {"step": N, "data": {...}} (orjson) a line
    verl = tmp_path / "verl_metrics.jsonl"
    verl.write_text("".join(json.dumps({"step": i + 1, "data": {"timing_s/step": s, "timing_s/gen": 4.0,
                                                                "timing_s/old_log_prob": 1.0, "timing_s/ref": 1.0,
                                                                "timing_s/update_actor": 3.0, "timing_s/update_weights": 0.5,
                                                                "response_length/mean": 200.0, "perf/total_num_tokens": 5e5,
                                                                "actor/perf/max_memory_allocated_gb": 30.0}}) + "\n"
                            for i, s in enumerate((90.0, 10.0, 12.0, 11.0))))
    steps = bench.ours_records(ours, cfg)
    assert [s["step_s"] for s in steps] == [60.0, 6.0, 8.0, 7.0] and steps[1]["log_prob_s"] == 1.0
    assert steps[0]["generated_tokens"] == 100.0 * 64 * 8 and steps[3]["memory_gib"] == 23.0
    summary = bench.summarise(steps, warmup=1)
    assert summary["steps_measured"] == 3 and summary["enough_steps"] and summary["median"]["step_s"] == 7.0
    assert summary["generated_tokens_per_s"] == pytest.approx(51200 / 3.5)
    assert summary["step_tokens_per_s_per_gpu"] == 1000.0
    verl_steps = bench.verl_records(verl, cfg)
    assert verl_steps[1] == {"step_s": 10.0, "gen_s": 4.0, "log_prob_s": 2.0, "update_s": 3.0, "weight_sync_s": 0.5,
                             "generated_tokens": 200.0 * 64 * 8, "total_tokens": 5e5, "memory_gib": 30.0}
    results = {"learning": {"ours": {**summary, "peak_gpu_memory_gib": 50.0},
                            "verl": {**bench.summarise(verl_steps, 1), "peak_gpu_memory_gib": 80.0},
                            "trl": {"steps_measured": 0, "peak_gpu_memory_gib": 40.0}}}
    assert bench.ratios(results, "verl", "step_s", False) == {"learning": round(11.0 / 7.0, 3)}
    assert bench.ratios(results, "trl", "step_s", False) == {}  # no TRL step measured: no ratio
    assert bench.ratios(results, "verl", "peak_gpu_memory_gib", True) == {"learning": 0.625}
    assert bench.ours_records(tmp_path / "missing.jsonl", cfg) == [] and bench.summarise([], 1) == {"steps_measured": 0}


def test_trl_steps_join_the_callbacks_times_with_generation_and_sync(tmp_path):
    steps = [{"step_s": 30.0, "max_memory_allocated_gib": 40.0}, {"step_s": 10.0, "max_memory_allocated_gib": 41.0}]
    bench_times = {"gen_s": [20.0, 5.0], "score_s": [25.0, 7.0], "sync_s": [0.4], "generated_tokens": [900, 800],
                   "total_tokens": [1900, 1800]}
    records = trl_gpu_run.step_records(steps, bench_times)
    assert records[0]["weight_sync_s"] == 0.0 and records[0]["gen_s"] == 20.0  # no push before the first step
    assert records[1] == {"step_s": 10.0, "max_memory_allocated_gib": 41.0, "gen_s": 4.6, "weight_sync_s": 0.4,
                          "log_prob_s": 2.0, "update_s": 3.0, "generated_tokens": 800, "total_tokens": 1800}
    path = tmp_path / "trl_steps.json"
    path.write_text(json.dumps({"steps": records}))
    assert bench.trl_records(path, bench.CONFIGS["learning"])[1]["memory_gib"] == 41.0


@pytest.mark.parametrize("name", sorted(bench.CONFIGS))
def test_trl_runner_builds_a_grpo_config_at_gpu_settings(name, tmp_path):
    if not TRL_WHEEL.exists():
        pytest.skip(f"{TRL_WHEEL.name} {NO_WHEEL}")
    cfg = bench.CONFIGS[name]
    argv = bench.trl_command(cfg, INPUTS, 5, tmp_path, name)[2:]
    # TrainingArguments refuses bf16 without a GPU: the check is lifted here, the rest is TRL's own
    script = ("import json, sys; import transformers.training_args as t; t.is_torch_bf16_gpu_available = lambda: True; "
              "import trl_gpu_run as r; c = r.grpo_config(r.parse_args(sys.argv[1:])); "
              "print(json.dumps({k: getattr(c, k) for k in ('generation_batch_size', 'gradient_accumulation_steps', "
              "'per_device_train_batch_size', 'num_generations', 'use_vllm', 'vllm_mode', 'bf16', "
              "'gradient_checkpointing', 'beta', 'vllm_gpu_memory_utilization', 'max_completion_length')}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRL_WHEEL), str(ROOT / "benchmarks" / "peers")])}
    out = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    config = json.loads(out.stdout.strip().splitlines()[-1])
    completions = cfg.prompts * cfg.n
    assert config["generation_batch_size"] == completions and config["num_generations"] == cfg.n
    assert config["per_device_train_batch_size"] * config["gradient_accumulation_steps"] == completions
    assert config["use_vllm"] and config["vllm_mode"] == "colocate" and config["bf16"] and config["beta"] == 0.001
    assert config["gradient_checkpointing"] == cfg.gradient_checkpointing
    assert config["vllm_gpu_memory_utilization"] == cfg.gpu_memory_utilization


def test_each_child_sees_its_own_site_only(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"/tmp/site:{ROOT}")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    verl = bench.child_env("verl", tmp_path)
    assert verl["PYTHONPATH"] == "/tmp/site-verl:/tmp/site" and "VLLM_ENABLE_V1_MULTIPROCESSING" not in verl
    assert verl["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "verl_metrics.jsonl")
    assert bench.child_env("trl", tmp_path)["PYTHONPATH"] == "/tmp/site-trl:/tmp/site"
    ours = bench.child_env("ours", tmp_path)
    assert ours["PYTHONPATH"] == f"/tmp/site:{ROOT}" and ours["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
