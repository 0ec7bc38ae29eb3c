"""The paper-length training summary (issue 28, part 1): the figures of each run from the trainer's
metrics, and the runs added to the committed paper_scale.json beside what it already holds."""

import json
import os

import pytest

from benchmarks import paper_scale_summary


def _write_run(folder, steps):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))


def _step(step, seconds, update, context=None, prompt=1000, response=1500, reserved=60.0):
    row = {"step": step, "timing_s/step": seconds, "timing_s/gen": seconds / 2, "timing_s/update_actor": update,
           "timing_s/ref": 1.0, "timing_s/tool": 0.5, "perf/mfu/actor": 0.3, "perf/throughput_tokens_per_s": 9000.0,
           "perf/max_memory_reserved_gb/update_actor": reserved, "prompt_length/max": prompt,
           "response_length/max": response}
    if context is not None:
        row["context_length/max"] = context
    return row


def test_figures_and_the_merge_into_the_report(tmp_path):
    runs = tmp_path / "paper_train" / "qwen2.5-3b"
    _write_run(runs / "grpo", [_step(1, 300.0, 200.0, 2100, reserved=90.0), _step(2, 60.0, 20.0, 3900),
                               _step(3, 50.0, 18.0, 3500), _step(4, 70.0, 22.0, 3000)])
    _write_run(runs / "ppo", [_step(1, 320.0, 210.0), _step(2, 80.0, 30.0, prompt=1200, response=2000)])
    # a VARIANT run: its own key, with the overrides it was started with
    _write_run(runs / "grpo_ref_moved", [_step(1, 300.0, 200.0), _step(2, 55.0, 20.0)])
    (runs / "grpo_ref_moved" / "overrides.txt").write_text("+recipe=paper_scale_one_gpu\nref.offload_policy=false\n")
    # the whole GPU's peak as benchmarks/gpu_peak.py records it beside the metrics
    (runs / "grpo_ref_moved" / "gpu_peak.json").write_text(json.dumps(
        {"peak_gpu_memory_gib": 71.5, "peak_gpu_memory_by_process_gib": {"ray::WorkerHost (7)": 46.0,
                                                                          "VLLM::EngineCore (9)": 25.5},
         "samples": 40, "interval_s": 1.0}))
    into = tmp_path / "paper_scale.json"
    into.write_text(json.dumps({"retriever": {"num_vectors": 10}, "train": {"qwen2.5-1.5b_grpo": {"steps": 3}}}))
    paper_scale_summary.main(["--runs_dir", str(runs), "--shape", "qwen2.5-3b", "--batch", "64",
                              "--output", str(tmp_path / "summary.json"), "--into", str(into)])
    grpo = json.loads((tmp_path / "summary.json").read_text())["runs"]["grpo"]
    figures = grpo["figures"]
    assert figures["steps_measured"] == 3 and figures["step_s"] == 60.0  # the median of steps 2-4
    assert figures["split_s"] == {"gen": 30.0, "update_actor": 20.0, "ref": 1.0}  # the step's phases, not tool
    assert figures["mfu_update"] == pytest.approx(0.3) and figures["tokens_per_s_per_gpu"] == 9000.0
    assert figures["peak_gpu_gib"] == 90.0  # step 1 included
    assert figures["longest_context_tokens"] == 3900  # the trainer's per-row maximum
    assert grpo["model_shape"] == "qwen2.5-3b" and grpo["max_prompt_length"] == 4096
    report = json.loads(into.read_text())
    assert report["retriever"] == {"num_vectors": 10}  # what the report held stays
    assert set(report["train"]) == {"qwen2.5-1.5b_grpo", "qwen2.5-3b_grpo", "qwen2.5-3b_ppo",
                                    "qwen2.5-3b_grpo_ref_moved"}
    assert report["train"]["qwen2.5-3b_grpo_ref_moved"]["overrides"] == [
        "+recipe=paper_scale_one_gpu", "ref.offload_policy=false"]
    assert report["train"]["qwen2.5-3b_grpo"]["overrides"] is None
    moved = report["train"]["qwen2.5-3b_grpo_ref_moved"]["figures"]
    assert moved["peak_gpu_whole_gib"] == 71.5 and moved["peak_gpu_by_process_gib"]["VLLM::EngineCore (9)"] == 25.5
    assert "peak_gpu_whole_gib" not in figures  # no gpu_peak.json beside that run
    ppo = report["train"]["qwen2.5-3b_ppo"]
    assert ppo["meta"]["commit"] and ppo["figures"]["steps_measured"] == 1
    # a log without context_length/max gives only a bound, named as one
    assert ppo["longest_context_tokens"] is None and ppo["longest_context_bound_tokens"] == 3200


def test_two_gpu_runs_are_keyed_apart_and_scaled_against_the_one_gpu_run(tmp_path):
    """paper_scale_train.sh with GPUS=2 puts its runs in <shape>/2gpu and passes --num_gpus 2: the report
    keys them <shape>_<algo>_2gpu and "scaling" compares each with the 1-GPU run (weak scaling: the same
    batch a GPU, so 2 GPUs at 0.8x one GPU's tokens/s/GPU are 1.6x its whole-step tokens/s)."""
    one, two, into = tmp_path / "qwen2.5-1.5b", tmp_path / "qwen2.5-1.5b" / "2gpu", tmp_path / "paper_scale.json"
    _write_run(one / "grpo", [_step(1, 300.0, 100.0), _step(2, 60.0, 20.0), _step(3, 60.0, 20.0)])
    _write_run(one / "ppo", [_step(1, 300.0, 100.0)])  # no step after the first: nothing to scale
    _write_run(two / "ppo", [_step(1, 300.0, 100.0)])
    run_two = [_step(1, 320.0, 110.0), _step(2, 75.0, 20.0), _step(3, 75.0, 20.0)]
    for step in run_two:
        step["perf/throughput_tokens_per_s"] = 14400.0  # both GPUs together
    _write_run(two / "grpo", run_two)
    common = ["--shape", "qwen2.5-1.5b", "--into", str(into)]
    paper_scale_summary.main(["--runs_dir", str(one), "--batch", "64", "--output", str(tmp_path / "one.json"),
                              *common])
    paper_scale_summary.main(["--runs_dir", str(two), "--batch", "128", "--num_gpus", "2",
                              "--output", str(tmp_path / "two.json"), *common])
    report = json.loads(into.read_text())
    assert set(report["train"]) == {"qwen2.5-1.5b_grpo", "qwen2.5-1.5b_ppo", "qwen2.5-1.5b_grpo_2gpu",
                                    "qwen2.5-1.5b_ppo_2gpu"}
    assert report["train"]["qwen2.5-1.5b_grpo_2gpu"]["figures"]["tokens_per_s_per_gpu"] == 7200.0
    assert report["scaling"] == {"qwen2.5-1.5b_grpo_2gpu": {
        "num_gpus": [1, 2], "train_batch_size": [64, 128], "step_s": [60.0, 75.0],
        "tokens_per_s_per_gpu": [9000.0, 7200.0], "efficiency": 0.8, "speedup": 1.6}}


def test_gpu_named_from_nvidia_smi_when_torch_is_not_loaded(tmp_path, monkeypatch):
    """The summary runs without torch: the report's GPU comes from nvidia-smi's CSV (a local stand-in here)."""
    import sys

    from benchmarks import common

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771'\necho 'NVIDIA H200, 143771'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert common._gpu_info() == {"name": "NVIDIA H200", "memory_gib": 140.4, "count": 2, "cuda": None}
    fake.write_text("#!/bin/sh\nexit 9\n")  # no driver: no GPU named
    assert common._gpu_info() is None
