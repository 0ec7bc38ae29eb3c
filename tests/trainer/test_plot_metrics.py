"""plot_metrics turns a jsonl metric log into PNG panels."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "plot_metrics.py"


def _module():
    spec = importlib.util.spec_from_file_location("plot_metrics", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plots_written(tmp_path):
    log = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "critic/score/mean": s / 10, "val/test_score/nq": s / 20, "timing_s/gen": 2.0,
             "timing_s/update_actor": 1.0, "actor/entropy": 1.5, "note": "x"} for s in range(1, 4)]
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    module = _module()
    series = module.read_metrics(log)
    assert series["critic/score/mean"] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert "note" not in series
    written = {p.name for p in module.plot(series, tmp_path / "plots")}
    assert written == {"score.png", "timing.png", "entropy.png"}
    assert all((tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG" for name in written)


def test_bad_line_named(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2: not JSON"):
        _module().read_metrics(log)
