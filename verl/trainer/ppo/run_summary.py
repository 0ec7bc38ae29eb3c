"""The lines a finished run ends with: what it did and where its outputs are.

Without them a run ends on the progress bar, and the user has to know the checkpoint layout
(``trainer.default_local_dir/global_step_N``, ``huggingface/``, ``logs/metrics.jsonl``) to find
what to load or plot next.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig

from verl.trainer.ppo import checkpointing

_SCORES = ("critic/score/mean", "val/test_score/all")


def closing_summary(cfg: DictConfig, global_step: int, total_steps: int, metrics: dict[str, float],
                    health: Sequence[str] = ()) -> str:
    """Summary of a finished run, one fact per line.

    Args:
        cfg: the run's (resolved) config; reads ``trainer.val_only``, ``trainer.default_local_dir``,
            ``trainer.log_dir`` and ``trainer.logger``.
        global_step: the step the run ended at; ``total_steps``: the step it was asked to reach.
        metrics: the last step's metrics (its validation metrics included when it validated).
        health: the training-health lines (``HealthMonitor.summary``: its alarms, or none).
    Returns:
        Text without a trailing newline: the steps, the last scores, the latest complete
        checkpoint, its Hugging Face export, the best checkpoint (``trainer.keep_best``), the
        health alarms and the metrics log (each only when it exists).
    """
    trainer = cfg.trainer
    scores = ", ".join(f"{key} {metrics[key]:.3f}" for key in _SCORES if key in metrics) or "no score logged"
    what = f"validation done at global step {global_step}" if trainer.val_only else \
        f"training done: global step {global_step} of {total_steps}"
    lines = [f"{what}; last {scores}"]
    checkpoint = checkpointing.find_latest(trainer.default_local_dir)
    if checkpoint is not None and not trainer.val_only:
        at_end = Path(checkpoint).name == checkpointing.step_dir(trainer.default_local_dir, global_step).name
        hint = ("to train on: the same command with a higher trainer.total_training_steps resumes here" if at_end
                else f"the latest; the run went on to step {global_step} without saving")
        lines.append(f"  checkpoint:   {checkpoint}  ({hint})")
        export = Path(checkpoint) / "huggingface"
        if export.is_dir():
            lines.append(f"  HF export:    {export}  (python infer.py --model {export} ...)")
        best = checkpointing.read_best(trainer.default_local_dir)
        if best is not None:
            lines.append(f"  best:         {checkpointing.step_dir(trainer.default_local_dir, best['step'])}  "
                         f"({best['metric']} {best['value']:.3f})")
    if not trainer.val_only:
        lines += list(health)
    log = Path(trainer.log_dir) / "metrics.jsonl"
    if "jsonl" in list(trainer.logger) and log.is_file():
        lines.append(f"  metrics:      {log}  (python scripts/plot_metrics.py {log})")
    return "\n".join(lines)
