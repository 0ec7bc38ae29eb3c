"""Settings of ``bash evaluate.sh`` / ``python -m verl.trainer.main_eval`` (``evaluation``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class EvaluationConfig:
    """Where the evaluation table goes and how much of the data it covers (docs/evaluation.md)."""

    output_dir: Optional[str] = None
    """`null`: `<global_step_N>/evaluation/<data>` for a checkpoint export, else `evaluations/<model>/<data>`"""
    max_per_source: Optional[int] = None
    """only the first N questions of each data source (file order); `null`: all"""
    num_resamples: int = 2000
    """bootstrap resamples of the 95% intervals"""
    html: bool = False
    """also write `report.html`: the summary and every question's trajectory, with filters
    (`evaluate.sh --html`; docs/evaluation.md)"""
