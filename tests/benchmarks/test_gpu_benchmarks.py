"""CPU smoke tests of the GPU benchmarks with the tiny shape: same code paths, tiny sizes.

The scripts run as subprocesses (the training one initialises a gloo process group for FSDP2), and
the tests check the JSON they write: every field the device run reports exists and is positive.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, out_dir: Path, *args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--out_dir", str(out_dir), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    name = script.removesuffix(".py")
    return json.loads((out_dir / f"{name}.json").read_text())


def test_shapes_match_published_parameter_counts():
    from benchmarks.shapes import SHAPES, build_random_model, total_params

    # Published sizes: Qwen2.5-0.5B 0.49B, 1.5B 1.54B, 3B 3.09B parameters.
    assert total_params(SHAPES["qwen2.5-0.5b"]) == 494_032_768
    assert total_params(SHAPES["qwen2.5-1.5b"]) == 1_543_714_304
    assert total_params(SHAPES["qwen2.5-3b"]) == 3_085_938_688
    import torch

    model = build_random_model(SHAPES["qwen2.5-0.5b"], torch.float32, "meta")
    assert sum(p.numel() for p in model.parameters()) == total_params(SHAPES["qwen2.5-0.5b"])


def test_gpu_generation_tiny(tmp_path):
    report = _run("gpu_generation.py", tmp_path, "--shapes", "tiny", "--batches", "2,4", "--prompt_len", "16",
                  "--new_tokens", "8", "--engines", "hf")
    assert report["meta"]["commit"] and "random" in report["weights"]
    runs = report["shapes"]["tiny"]["hf"]
    assert [r["batch"] for r in runs] == [2, 4]
    for run in runs:
        assert run["generated_tokens"] == run["batch"] * 8
        for key in ("seconds", "tokens_per_s", "bound_tokens_per_s", "fraction_of_bound"):
            assert run[key] > 0, (key, run)
    assert "goals" in report


def test_gpu_generation_goals_use_the_median_of_repeated_runs():
    """Repeated batch-256 runs (the host-side share of a decode step varies between them) are
    judged by their median, for the bound fraction and for the ratio to transformers."""
    from benchmarks.gpu_generation import goals

    def run(tps, frac, decode_frac):
        return {"batch": 256, "tokens_per_s": tps, "fraction_of_bound": frac, "decode_fraction_of_bound": decode_frac}

    vllm_runs = [run(30.0, 0.20, 0.22), run(50.0, 0.33, 0.35), run(40.0, 0.26, 0.29), {"batch": 256, "skipped": "x"}]
    shapes = {"s": {"hf": [{"batch": 256, "tokens_per_s": 10.0}], "vllm": {"runs": vllm_runs}}}
    entry = goals(shapes)["s"]
    assert entry["vllm_runs_at_256"] == 3
    assert entry["vllm_fraction_of_bound_at_256"] == 0.26 and entry["goal_25pct_bound_met"]
    assert entry["vllm_decode_fraction_of_bound_at_256"] == 0.29
    assert entry["vllm_over_generate_at_256"] == 4.0 and entry["goal_3x_met"]
    assert goals({"s": {"vllm": {"runs": [run(30.0, 0.20, 0.24)]}}})["s"]["goal_25pct_bound_met_decode_only"] is False
    two = goals({"s": {"vllm": {"runs": [run(50.0, 0.33, 0.35), run(30.0, 0.20, 0.22)]}}})["s"]
    assert two["vllm_fraction_of_bound_at_256"] == 0.20  # an even count takes the lower middle run


def test_host_probe_keeps_sub_millisecond_resolution():
    """The probe reports the clock's full resolution: a short probe (1,000 loops take tens of
    microseconds on a fast host) is not rounded to 0. The clock is given, so the figure does not
    depend on the host's speed."""
    from benchmarks.gpu_generation import host_probe_ms

    ticks = iter([5_000, 45_000])  # nanoseconds: 40 us between the two reads
    assert host_probe_ms(1000, clock=lambda: next(ticks)) == pytest.approx(0.04, rel=1e-12)


def test_generate_projection_counts_the_prefill_once():
    """Two warm calls (1 and 1 + 8 new tokens) give the prefill and the per-token decode time; a
    call of any length is their line. Here ``generate`` costs 2.0 s for the prefill and first
    token plus 0.1 s per further token, so 512 tokens take 53.1 s (scaling the 8-token call by
    512 / 8 would say 172.8 s)."""
    from benchmarks.gpu_generation import project_generate_s

    def cost(new_tokens):
        return 2.0 + 0.1 * (new_tokens - 1)

    assert project_generate_s(cost(1), cost(9), 8, 512) == pytest.approx(cost(512))
    assert project_generate_s(cost(1), cost(9), 8, 1) == pytest.approx(cost(1))


def test_gpu_generation_time_box_skips(tmp_path):
    report = _run("gpu_generation.py", tmp_path, "--shapes", "tiny", "--batches", "2", "--prompt_len", "8",
                  "--new_tokens", "64", "--engines", "hf", "--hf_config_budget_s", "0")
    (run,) = report["shapes"]["tiny"]["hf"]
    assert "projected" in run["skipped"] and run["projected_s"] > 0


def test_gpu_train_tiny(tmp_path):
    report = _run("gpu_train.py", tmp_path, "--shapes", "tiny", "--rows", "8", "--prompt_min", "8",
                  "--prompt_max", "12", "--resp_min", "2", "--resp_max", "20", "--resp_median", "8",
                  "--max_token_len", "128", "--micro_rows", "4", "--steps", "1",
                  "--configs", "actor_packed,actor_padded,baseline_padded", "--time_budget_s", "1200")
    assert "random" in report["weights"]
    entry = report["shapes"]["tiny"]
    assert entry["flops_per_update"]["total_flops"] > entry["flops_per_update"]["dense_flops"] > 0
    assert set(entry["runs"]) == {"actor_packed", "actor_padded", "baseline_padded"}
    for name, run in entry["runs"].items():
        assert "skipped" not in run, (name, run)
        for key in ("seconds_per_update", "tokens_per_s", "achieved_tflops", "mfu"):
            assert run[key] > 0, (name, key, run)
        assert run["tokens_per_update"] == entry["flops_per_update"]["tokens"]
    assert report["goals"]["tiny"]["actor_packed"]["over_baseline_same_ckpt"] > 0


def test_offload_moves_tiny(tmp_path):
    """Both ways make every round trip; the home is one buffer of exactly the module's tensors (the
    parameters and the rotary buffer, each padded to the alignment) and page-locked on a GPU."""
    from benchmarks.shapes import SHAPES, total_params

    report = _run("offload_moves.py", tmp_path, "--shape", "tiny", "--round_trips", "3", "--dtype", "bf16")
    assert report["param_bytes"] == 2 * total_params(SHAPES["tiny"])
    assert report["param_bytes"] < report["home_bytes"] < report["param_bytes"] + 2**20
    assert report["home_page_locked"] is (report["device"] != "cpu")
    for way in ("pageable", "home"):
        entry = report["by_way"][way]
        assert len(entry["round_trip_s"]) == 2  # the first round trip is warm-up
        assert entry["round_trip_range_s"] == [min(entry["round_trip_s"]), max(entry["round_trip_s"])]
    assert "ratio_round_trip" in report


def test_cpu_packing_tiny(tmp_path):
    """The CPU packing benchmark (a CPU benchmark, checked here with the others) on a tiny batch."""
    report = _run("cpu_packing.py", tmp_path, "--rows", "2", "--prompt_len", "16", "--response_len", "16")
    assert set(report["seconds_fwd_bwd"]) == {"padded", "packed_one_row", "packed_rows_1024", "packed_rows_2048"}
    assert all(v > 0 for v in report["seconds_fwd_bwd"].values())
    assert report["ratio_to_padded"]["padded"] == 1.0
    assert 0 < report["real_tokens"] < report["padded_tokens"] == 64


def test_saved_random_model_loads_with_the_borrowed_tokenizer(tmp_path, smollm2_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks import shapes
    from benchmarks.save_random_model import save_random_model

    # A 2-layer shape with Qwen's vocabulary: the real code path at a CPU-friendly size.
    small = shapes.Shape(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128)
    monkeypatch.setitem(shapes.SHAPES, "small-qwen-vocab", small)

    # tiny's vocab is smaller than SmolLM2's tokenizer: the saver must refuse it by name.
    with pytest.raises(ValueError, match="ids > vocab"):
        save_random_model("tiny", smollm2_path, str(tmp_path / "tiny"))
    path = save_random_model("small-qwen-vocab", smollm2_path, str(tmp_path / "small"))
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == 151_936
    assert sum(p.numel() for p in model.parameters()) == shapes.total_params(small)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_retriever_scale_benchmark_end_to_end_at_a_tiny_size(tmp_path):
    """All four stages through real servers (CPU): the report has every figure the device run reports."""
    out = tmp_path / "report.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "retriever_scale.py"), "--data_dir",
                           str(tmp_path / "data"), "--num_vectors", "3000", "--encoder_layers", "1",
                           "--load_scale", "0.002", "--ann_vectors", "2000", "--ann_nlist", "16", "--pq_bytes", "8",
                           "--hnsw_m", "8", "--output", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["retriever"]["num_vectors"] == 3000 and report["meta"]["commit"]
    assert set(report["host_probe_ms"]) == {"gen", "start", "load", "ann"}  # one probe before each stage
    assert report["start"]["cold_first"]["resident_before"]["synthetic_Flat.index"] < 0.5
    assert report["start"]["cold_restart"]["load_s"]["corpus"] > 0
    load = report["load"]["cpu"]
    assert {"concurrent_1", "concurrent_64", "concurrent_256", "batch_512"} <= set(load)
    assert all(load[k]["qps"] > 0 and load[k]["p99_ms"] >= load[k]["p50_ms"] for k in ("concurrent_256", "batch_512"))
    entries = {(e["name"], json.dumps(e.get("params"))): e for e in report["ann"]["entries"]}
    assert entries[("Flat (torch)", "null")]["recall_at_10"] == 1.0
    assert entries[("IVF16,Flat", json.dumps({"nprobe": 16}))]["recall_at_10"] == 1.0  # every list searched
    assert 0 < entries[("HNSW8", json.dumps({"efSearch": 64}))]["recall_at_10"] <= 1.0
    assert set(report["goals"]) >= {"start_cold_under_180_s", "qps_256_callers_at_least_2000"}
    assert "qps_256_callers_cpu" in report["extrapolated_21m"]
