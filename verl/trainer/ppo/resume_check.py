"""Whether resuming a checkpoint makes sense for this run, decided before any worker starts.

``trainer.resume_mode=auto`` resumes the latest checkpoint under ``trainer.default_local_dir``. Two
runs of the train scripts share that folder when they share an experiment name, so a run on other
data would silently continue the old run's model and data position, and a run whose target step the
checkpoint already reached would train nothing and exit 0. Each checkpoint therefore records what it
was trained on (:func:`train_data_record`, in ``trainer_state.json``), and :func:`check_resume`
refuses both cases in one line that says what to do.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from verl.trainer.ppo import checkpointing
from verl.utils.config import ConfigError

RECORD_KEY = "train_data"
_FRESH_START = ("give the run its own experiment name (EXPERIMENT_NAME=NAME bash train_*.sh, or "
                "trainer.experiment_name=NAME) or start afresh in that folder with trainer.resume_mode=disable")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def train_data_record(files) -> list[dict]:
    """What a run trains on: ``[{"path", "bytes", "sha256"}]`` per file of ``data.train_files``, in order.

    The content hash, not the path, identifies the data: a moved clone resumes, a rewritten file
    does not.
    """
    files = [files] if isinstance(files, str) else list(files)
    record = []
    for file in files:
        path = Path(file).expanduser().resolve()
        record.append({"path": str(path), "bytes": path.stat().st_size, "sha256": _sha256(path)})
    return record


def _names(record: list[dict]) -> str:
    return ", ".join(item["path"] for item in record)


def check_resume(cfg, record: list[dict], total_steps: int | None) -> None:
    """Refuse to resume a checkpoint trained on other data, or one already at the run's target step.

    Args:
        cfg: the run's ``PPOConfig`` (reads ``trainer.resume_mode``, ``default_local_dir``, ``val_only``).
        record: :func:`train_data_record` of this run's ``data.train_files``.
        total_steps: the step the run trains to; None when not known yet (epochs over data not loaded).
    Raises:
        ConfigError: one line naming the checkpoint, what differs, and what to do. A checkpoint written
            before records existed is compared on its step only; ``trainer.val_only`` runs are never refused.
    """
    trainer = cfg.trainer
    try:
        path = checkpointing.resolve_resume_path(trainer.resume_mode, trainer.default_local_dir)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if path is None or trainer.val_only:
        return
    state = json.loads((path / checkpointing.STATE_FILE).read_text())
    recorded = state.get(RECORD_KEY)
    if recorded is not None and [r["sha256"] for r in recorded] != [r["sha256"] for r in record]:
        raise ConfigError(f"trainer.resume_mode={trainer.resume_mode}: {path} was trained on {_names(recorded)}, "
                          f"not on data.train_files={_names(record)}; {_FRESH_START}")
    step = int(state["global_step"])
    if total_steps is not None and step >= total_steps:
        raise ConfigError(f"trainer.resume_mode={trainer.resume_mode}: {path} is already at global step {step} "
                          f"and this run trains to step {total_steps}: nothing to train; set "
                          f"trainer.total_training_steps above {step} to continue it, or {_FRESH_START}")
