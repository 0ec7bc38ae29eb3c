"""benchmarks/vs_peers_merge.py: the report of several device holds takes each ratio from one hold, where
ours and that peer ran back to back, and refuses a file that is not a vs_peers_gpu.py report by name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import vs_peers_merge  # noqa: E402


def hold_run(step_s: float, memory_gib: float, enough: bool = True, tokens: float | None = None) -> dict:
    median = {"step_s": step_s} if tokens is None else {"step_s": step_s, "generated_tokens": tokens}
    return {"median": median, "peak_gpu_memory_gib": memory_gib, "enough_steps": enough}


def test_merged_holds_take_each_ratio_from_one_hold(tmp_path, capsys):
    a = {"meta": {"commit": "a", "gpu": None}, "goal": "g", "results": {
        "qwen1.5b": {"ours": hold_run(150.0, 100.0, tokens=3e5), "verl": hold_run(300.0, 125.0, tokens=2e5)},
        "learning": {"ours": hold_run(3.0, 90.0), "trl": hold_run(9.0, 95.0, enough=False)}}}
    b = {"meta": {"commit": "b", "gpu": {"name": "NVIDIA H100 80GB HBM3"}}, "goal": "g",
         "ratio_absent": {"search": {"trl": "why"}}, "results": {
        "qwen1.5b": {"ours": hold_run(160.0, 100.0), "trl": hold_run(320.0, 110.0),
                     "ours-mb32k": {**hold_run(200.0, 77.0), "overrides": ["k=1"]},
                     "ours-cut": {**hold_run(0.0, 60.0, enough=False), "overrides": ["k=2"]}}},
         # the hold's own block as an older driver wrote it, with a variant cut before its steps
         "variants": {"ours-cut": {"qwen1.5b": {"overrides": ["k=2"], "memory_vs_trl": 0.545}}}}
    paths = []
    for name, hold in (("hold_a.json", a), ("hold_b.json", b)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(hold))
    out = tmp_path / "merged.json"
    assert vs_peers_merge.main([*map(str, paths), "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    # veRL's ratio against hold A's ours (150 s), TRL's against hold B's (160 s): never across holds
    assert merged["ratio_step_vs_verl"] == {"qwen1.5b": 2.0} and merged["ratio_step_vs_trl"] == {"qwen1.5b": 2.0}
    assert merged["ratio_memory_vs_verl"] == {"qwen1.5b": 0.8}
    # the work of hold A's two steps (ours 1.5x veRL's tokens); hold B's runs state none: no ratio
    assert merged["ratio_generated_vs_verl"] == {"qwen1.5b": 1.5} and merged["ratio_generated_vs_trl"] == {}
    assert {peer: {name: pair["hold"] for name, pair in by_name.items()} for peer, by_name in merged["pairs"].items()
            } == {"verl": {"qwen1.5b": "hold_a.json"}, "trl": {"qwen1.5b": "hold_b.json"}}
    assert merged["pairs"]["trl"]["qwen1.5b"]["ours"]["median"] == {"step_s": 160.0}
    # each pair names the card its hold ran on (hold A's meta has none: a CPU machine's null)
    assert merged["pairs"]["trl"]["qwen1.5b"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert merged["pairs"]["verl"]["qwen1.5b"]["gpu"] is None
    assert "learning" not in merged["ratio_step_vs_trl"]  # TRL's run there had too few steps
    assert merged["ratio_absent"] == {"search": {"trl": "why"}}
    # a variant of ours is compared within its own hold; one cut before its steps is left out
    assert merged["variants"] == {"ours-mb32k": {"qwen1.5b": {
        "hold": "hold_b.json", "overrides": ["k=1"], "step_vs_ours": 0.8, "memory_vs_ours": 0.77,
        "step_vs_trl": 1.6, "memory_vs_trl": 0.7}}}
    assert merged["holds"] == [{"file": "hold_a.json", "meta": a["meta"]},
                               {"file": "hold_b.json", "meta": b["meta"]}]
    bad = tmp_path / "bad.json"
    bad.write_text('{"results": {}}')
    with pytest.raises(SystemExit):
        vs_peers_merge.main([str(bad), "--out", str(out)])
    assert "bad.json" in capsys.readouterr().err
