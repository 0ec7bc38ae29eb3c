"""Loggers write what they are given: jsonl lines, tensorboard events, console lines."""

import json

import pytest

from verl.utils.tracking import Tracking


def test_jsonl_tensorboard_console(tmp_path, capsys):
    tracker = Tracking("p", "e", ["console", "jsonl", "tensorboard"], tmp_path)
    tracker.log({"critic/score/mean": 0.5, "timing_s/step": 1.25}, step=1)
    tracker.log({"critic/score/mean": 0.75}, step=2)
    tracker.finish()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "critic/score/mean": 0.5, "timing_s/step": 1.25},
                    {"step": 2, "critic/score/mean": 0.75}]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert "step:2 - critic/score/mean:0.75" in capsys.readouterr().out


def test_unknown_backend_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown backend\(s\) \['mlflow'\]"):
        Tracking("p", "e", ["mlflow"], tmp_path)
