"""Metric loggers: console, jsonl, tensorboard and wandb behind one ``Tracking.log`` call.

``trainer.logger`` lists the backends. wandb runs offline when ``WANDB_API_KEY`` is not set, so a
machine without network or account still records its run (``wandb sync`` uploads it later).
The jsonl backend writes one JSON object per step (``{"step": N, ...metrics}``) to
``<log_dir>/metrics.jsonl``; ``scripts/plot_metrics.py`` reads that file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

SUPPORTED_BACKENDS = ("console", "jsonl", "tensorboard", "wandb")


def _to_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class ConsoleLogger:
    """Prints ``step N | key:value ...`` lines with compact float formatting."""

    def log(self, data: dict[str, Any], step: int) -> None:
        parts = []
        for key in sorted(data):
            value = _to_float(data[key])
            parts.append(f"{key}:{value:.4g}" if value is not None else f"{key}:{data[key]}")
        print(f"step:{step} - " + " - ".join(parts), flush=True)

    def finish(self) -> None:
        pass


class JsonlLogger:
    """Appends one line per step to ``<log_dir>/metrics.jsonl`` (flushed, so a killed run keeps it)."""

    def __init__(self, log_dir: str | os.PathLike):
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(log_dir) / "metrics.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, data: dict[str, Any], step: int) -> None:
        row = {"step": step}
        for key, value in data.items():
            number = _to_float(value)
            row[key] = number if number is not None and math.isfinite(number) else str(value)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def finish(self) -> None:
        self._file.close()


class TensorboardLogger:
    """Scalars to a tensorboard event file under ``<log_dir>/tensorboard``."""

    def __init__(self, log_dir: str | os.PathLike):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(Path(log_dir) / "tensorboard"))

    def log(self, data: dict[str, Any], step: int) -> None:
        for key, value in data.items():
            number = _to_float(value)
            if number is not None:
                self._writer.add_scalar(key, number, step)
        self._writer.flush()

    def finish(self) -> None:
        self._writer.close()


class WandbLogger:
    """wandb run; ``mode="offline"`` unless ``WANDB_API_KEY`` is set (or ``WANDB_MODE`` says otherwise)."""

    def __init__(self, project: str, experiment: str, config: dict, log_dir: str | os.PathLike):
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self._run = wandb.init(project=project, name=experiment, config=config, mode=mode,
                               dir=str(log_dir))

    def log(self, data: dict[str, Any], step: int) -> None:
        self._run.log(data, step=step)

    def finish(self) -> None:
        self._run.finish()


class Tracking:
    """Fan-out of metrics to the configured backends.

    Args:
        project_name, experiment_name: run identity (wandb project/name).
        backends: subset of ``SUPPORTED_BACKENDS``.
        log_dir: folder for jsonl/tensorboard/wandb files.
        config: plain dict of the run configuration (stored by wandb).
    Raises:
        ValueError: an unknown backend name.
    """

    def __init__(self, project_name: str, experiment_name: str, backends, log_dir: str | os.PathLike,
                 config: dict | None = None):
        backends = [backends] if isinstance(backends, str) else list(backends)
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; choose from {list(SUPPORTED_BACKENDS)}")
        self.log_dir = Path(log_dir)
        self.loggers = []
        for name in backends:
            if name == "console":
                self.loggers.append(ConsoleLogger())
            elif name == "jsonl":
                self.loggers.append(JsonlLogger(log_dir))
            elif name == "tensorboard":
                self.loggers.append(TensorboardLogger(log_dir))
            elif name == "wandb":
                self.loggers.append(WandbLogger(project_name, experiment_name, config or {}, log_dir))

    def log(self, data: dict[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.log(data, step)

    def finish(self) -> None:
        for logger in self.loggers:
            logger.finish()
