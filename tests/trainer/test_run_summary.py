"""The closing lines of a finished run: steps, last scores, checkpoint, HF export, metrics log."""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

from verl.trainer.ppo import checkpointing
from verl.trainer.ppo.run_summary import closing_summary
from verl.utils.tracking import Tracking

from .helpers import REPO


def _config(root, **trainer):
    return OmegaConf.create({"trainer": {"val_only": False, "default_local_dir": str(root),
                                         "log_dir": str(root / "logs"), "logger": ["console", "jsonl"], **trainer}})


def _save(root, step: int, export: bool) -> None:
    def save_workers(folder):
        (folder / "actor").mkdir()
        if export:
            (folder / "huggingface").mkdir()

    checkpointing.save_checkpoint(root, step, {"data": {}, "kl_coef": 0.0}, save_workers)


def test_summary_names_the_latest_checkpoint_export_and_metrics(tmp_path):
    root = tmp_path / "run"
    tracker = Tracking("p", "e", ["jsonl"], root / "logs")
    for step in (1, 2, 3):
        tracker.log({"critic/score/mean": 0.1 * step}, step=step)
    tracker.finish()
    _save(root, 2, export=True)
    _save(root, 3, export=True)
    text = closing_summary(_config(root), 3, 3, {"critic/score/mean": 0.3, "val/test_score/all": 0.25})
    lines = text.splitlines()
    assert lines[0] == "training done: global step 3 of 3; last critic/score/mean 0.300, val/test_score/all 0.250"
    assert lines[1].startswith(f"  checkpoint:   {root / 'global_step_3'}")
    assert lines[2].startswith(f"  HF export:    {root / 'global_step_3' / 'huggingface'}")
    assert lines[3].startswith(f"  metrics:      {root / 'logs' / 'metrics.jsonl'}")


def test_summary_leaves_out_what_the_run_did_not_write(tmp_path):
    text = closing_summary(_config(tmp_path, logger=["console"]), 2, 5, {})
    assert text == "training done: global step 2 of 5; last no score logged"
    _save(tmp_path, 2, export=False)
    lines = closing_summary(_config(tmp_path), 2, 5, {"critic/score/mean": 0.0}).splitlines()
    assert len(lines) == 2 and "checkpoint:" in lines[1]
    val_only = closing_summary(_config(tmp_path, val_only=True), 2, 5, {"val/test_score/all": 0.5})
    assert val_only == "validation done at global step 2; last val/test_score/all 0.500"


def test_warm_start_labels_the_folder_it_prints(tmp_path, monkeypatch, capsys):
    """``scripts/warm_start.py`` (run by the quickstart before training) says what its path is."""
    sys.path.insert(0, str(REPO / "scripts"))
    import warm_start

    monkeypatch.setenv("SEARCH_R1_CACHE", str(tmp_path / "cache"))
    cached = warm_start.warm_start_dir()
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    warm_start.main(["--output", str(tmp_path / "out")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"warm start: RL starts from {tmp_path / 'out' / 'huggingface'} (-> {cached})"
