"""CPU smoke test of ``benchmarks/async_rollout.py`` on the tiny model with forced turns: both modes
roll out the same rows against the real BM25 server and behind the latency proxy, and the JSON
carries the issue's top-level ratios and the figures of each run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_async_rollout_benchmark_reports_both_modes(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1"}
    # --max_tokens 40: each turn decodes 8-24 real tokens, then gets its forced 16-32-token search tag;
    # --num_kv_blocks 6 (~660 tokens) holds one 552-token row, not the four rows' ~1,200: vLLM must preempt
    args = ["--device", "cpu", "--models", "tiny", "--batch_size", "2", "--n", "2", "--max_turns", "2",
            "--max_tokens", "40", "--max_obs_length", "64", "--max_prompt_length", "512", "--latency_ms", "20,60",
            "--answer_prob", "0", "--engine_stats", "--num_kv_blocks", "6",
            "--step_model", "none", "--out_dir", str(tmp_path)]
    # an earlier report of the same model (another machine's, say): merged, it stays beside the new entry
    earlier = {"model": "tiny", "made_by": {"commit": "earlier"},
               "runs": {name: {"ratio_sync_over_async": 9.0} for name in ("local", "latency")}}
    (tmp_path / "earlier.json").write_text(json.dumps({"rollout": [earlier]}))
    args += ["--merge_from", str(tmp_path / "earlier.json")]
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "async_rollout.py"), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "async_rollout.json").read_text())
    assert [key for key in report if key != "meta"][:3] == ["ratio_rollout_local", "ratio_rollout_latency",
                                                           "ratio_rollout_model"]
    kept, entry = report["rollout"]
    assert kept == earlier and entry["model"] == "tiny" and entry["rows"] == 4
    assert report["ratio_rollout_local"] == entry["runs"]["local"]["ratio_sync_over_async"] != 9.0  # the newest
    # a merged report keeps each section's own commit and engine settings
    assert entry["made_by"]["commit"] == report["meta"]["commit"] != "unknown"
    assert entry["made_by"]["engine_process"] is False and entry["made_by"]["max_num_seqs"] is None
    assert entry["made_by"]["gpu"] is None and entry["made_by"]["num_kv_blocks"] == 6  # the CPU, the small cache
    assert entry["made_by"]["engine_stats"] is True
    preempted = [entry["runs"][r][mode]["preemptions"] for r in ("local", "latency") for mode in ("sync", "async")]
    assert all(isinstance(count, int) and count >= 0 for count in preempted) and sum(preempted) > 0, preempted
    for retriever in ("local", "latency"):
        runs = entry["runs"][retriever]
        for mode in ("sync", "async"):
            run = runs[mode]
            assert run["generated_tokens"] > 0 and run["searches"] > 0 and run["host_probe_ms"] > 0
            # vLLM's counters over the run: every prompt token looked up in the prefix cache, the hits not prefilled
            assert run["prompt_tokens"] == run["prefix_cache_queries"] > 0, run
            assert 0 < run["prefix_cache_hits"] < run["prompt_tokens"], run
            assert run["prefilled_tokens"] == run["prompt_tokens"] - run["prefix_cache_hits"]
        assert runs["ratio_sync_over_async"] == pytest.approx(runs["sync"]["rollout_s"] / runs["async"]["rollout_s"],
                                                            rel=0.01)
        assert runs["async"]["peak_searches_in_flight"] >= 1
    # one request per retrieved search (a search in the last turn ends its row without one)
    latency = entry["runs"]["latency"]["async"]
    assert 0 < latency["proxy_requests"] <= latency["searches"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_step_variants_pass_the_trainers_checks(device, tmp_path):
    """The whole-step runs of the benchmark (sync, async, sync with ``rollout.staleness=1``) are
    configurations the trainer accepts, staleness 1 with the engine resident and TIS on; the step
    section's staleness ratio goes to the top of the JSON as ``ratio_step_staleness``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import async_rollout

    from verl.trainer.main_ppo import parse_config

    args = async_rollout.parse_args(["--device", device, "--step_batch_size", "4", "--step_n", "2"])
    for variant, (mode, staleness, split) in async_rollout.STEP_VARIANTS.items():
        cfg = parse_config(async_rollout.step_overrides("/models/x", variant, args, tmp_path, "http://127.0.0.1:1"))
        rollout = cfg.actor_rollout_ref.rollout
        assert (rollout.mode, rollout.staleness) == (mode, staleness)
        assert cfg.actor_rollout_ref.hybrid_engine != split and cfg.rollout.n_gpus_per_node == int(split)
        if staleness:
            assert not rollout.free_cache_engine and cfg.actor_rollout_ref.actor.tis_imp_ratio_cap > 0
    assert async_rollout.step_variants(args) == ["sync", "async", "sync_staleness1"]  # one GPU's by default
    with pytest.raises(SystemExit, match="unknown \\['split'\\]"):
        async_rollout.step_variants(async_rollout.parse_args(["--step_variants", "sync,split"]))
    own = {"recipe": "", "ratio_sync_over_async": 0.9, "ratio_staleness0_over_1": 1.4, "ratio_staleness0_over_split": 1.9}
    report = {"rollout": [], "step": [own]}
    assert list(async_rollout.summarize(report))[:3] == ["ratio_step_latency", "ratio_step_staleness",
                                                         "ratio_step_staleness_split"]
    # a recipe's steps (another shape) stay in the list, not at the top; a newer own-shape section leads
    recipe = {"recipe": "learning_gpu", "ratio_sync_over_async": 1.3}
    head = async_rollout.summarize({"rollout": [], "step": [own, recipe]})
    assert head["ratio_step_latency"] == 0.9 and head["step"] == [own, recipe]
    assert async_rollout.summarize({"rollout": [], "step": [own, recipe, {**own, "ratio_sync_over_async": 1.1}]}
                                   )["ratio_step_latency"] == 1.1
    assert "ratio_step_latency" not in async_rollout.summarize({"rollout": [], "step": [recipe]})
    apart = async_rollout.parse_args(["--device", device, "--engine_process", "--max_num_seqs", "2560"])
    for variant in async_rollout.STEP_VARIANTS:
        cfg = parse_config(async_rollout.step_overrides("/models/x", variant, apart, tmp_path, "http://127.0.0.1:1"))
        assert cfg.actor_rollout_ref.rollout.engine_process and cfg.actor_rollout_ref.rollout.max_num_seqs == 2560
    # the learning recipe's step (issue 30: async as its default where it wins), its batch from the flags
    learning = async_rollout.parse_args(["--device", device, "--step_recipe", "learning_gpu", "--step_batch_size", "64",
                                         "--step_n", "8", "--max_turns", "2", "--max_tokens", "320"])
    for variant, (mode, staleness, _) in async_rollout.STEP_VARIANTS.items():
        cfg = parse_config(async_rollout.step_overrides("/models/x", variant, learning, tmp_path, "http://127.0.0.1:1"))
        actor = cfg.actor_rollout_ref.actor
        assert (cfg.actor_rollout_ref.rollout.mode, cfg.actor_rollout_ref.rollout.staleness) == (mode, staleness)
        assert actor.optim.lr == 2e-5 and actor.ppo_max_token_len_per_gpu == 65536  # the recipe's
        assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n, actor.ppo_mini_batch_size) == (64, 8, 64)
        assert (cfg.max_turns, cfg.data.max_response_length) == (2, 320)


def test_top_level_rollout_ratios_are_the_1_5b_shapes():
    """Issue 30: the rollout ratios at the top of the JSON are the 1.5B shape's when it ran, else the
    warm start's, and ``ratio_rollout_model`` names the model they come from."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import async_rollout

    def entry(model, local, latency):
        return {"model": model, "runs": {"local": {"ratio_sync_over_async": local},
                                         "latency": {"ratio_sync_over_async": latency}}}

    runs = [entry("warm_start", 0.7, 0.6), entry("qwen2.5-3b", 1.1, 1.9), entry("qwen2.5-1.5b", 1.3, 2.2)]
    head = async_rollout.summarize({"rollout": runs})
    assert (head["ratio_rollout_local"], head["ratio_rollout_latency"], head["ratio_rollout_model"]) == (1.3, 2.2,
                                                                                                       "qwen2.5-1.5b")
    head = async_rollout.summarize({"rollout": runs[:2]})
    assert head["ratio_rollout_model"] == "warm_start" and head["ratio_rollout_local"] == 0.7
    # a merged report with the 1.5B shape measured twice: the newer entry (another engine setting) leads
    head = async_rollout.summarize({"rollout": [*runs, entry("qwen2.5-1.5b", 1.05, 1.2)]})
    assert (head["ratio_rollout_local"], head["ratio_rollout_latency"]) == (1.05, 1.2)
