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
    args = ["--device", "cpu", "--models", "tiny", "--batch_size", "2", "--n", "2", "--max_turns", "2",
            "--max_tokens", "64", "--max_obs_length", "64", "--max_prompt_length", "1024", "--latency_ms", "20,60",
            "--answer_prob", "0",
            "--step_model", "none", "--out_dir", str(tmp_path)]
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "async_rollout.py"), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "async_rollout.json").read_text())
    assert [key for key in report if key != "meta"][:3] == ["ratio_rollout_local", "ratio_rollout_latency",
                                                           "ratio_rollout_model"]
    (entry,) = report["rollout"]
    assert entry["model"] == "tiny" and entry["rows"] == 4
    for retriever in ("local", "latency"):
        runs = entry["runs"][retriever]
        for mode in ("sync", "async"):
            run = runs[mode]
            assert run["generated_tokens"] > 0 and run["searches"] > 0 and run["host_probe_ms"] > 0
        assert runs["ratio_sync_over_async"] == pytest.approx(runs["sync"]["rollout_s"] / runs["async"]["rollout_s"],
                                                            rel=0.01)
        assert runs["async"]["peak_searches_in_flight"] >= 1
    # one request per retrieved search (a search in the last turn ends its row without one)
    latency = entry["runs"]["latency"]["async"]
    assert 0 < latency["proxy_requests"] <= latency["searches"]
