"""Trainer checkpoints: step folders written atomically, a latest pointer, retention and resume.

Layout (veRL's, so its tools find it)::

    <default_local_dir>/
        global_step_N/
            actor/            worker state: model, optimizer, LR scheduler, RNG (written by the worker)
            critic/           same for the critic (PPO)
            huggingface/      the actor as an HF folder (AutoModelForCausalLM.from_pretrained)
            trainer_state.json  global step, data-sampler position, KL coefficient, controller RNG,
                                what it was trained on (``train_data``: the train files and their hashes)
        latest_checkpointed_iteration.txt
        best_checkpoint.json  with ``trainer.keep_best``: {"step", "metric", "value"} of the best
                              validation so far; that step folder is never pruned

Why atomic: a crash while saving must never leave a folder that looks complete. Everything is
written under ``.global_step_N.tmp``; ``trainer_state.json`` is written last; then the folder is
renamed (one ``rename`` on one file system) and only then the pointer is replaced (``os.replace``).
A folder without ``trainer_state.json`` or with a ``.tmp`` name is never resumed from, and
:func:`discard_partial` removes the leftovers of a save that was cut short once no worker writes
any more (a run stopped by a signal during a save ends with the previous checkpoint as the latest,
and nothing half written).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"
BEST_FILE = "best_checkpoint.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def is_complete(path: str | os.PathLike) -> bool:
    """A checkpoint folder is usable once its trainer state (written last) exists."""
    return (Path(path) / STATE_FILE).is_file()


def controller_rng_state() -> dict:
    """Python/numpy/torch RNG state of the controller process, JSON-serialisable."""
    py_state = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py_state[0], list(py_state[1]), py_state[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state().tolist(),
    }


def restore_controller_rng(state: dict) -> None:
    version, inner, gauss = state["python"]
    random.setstate((version, tuple(inner), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def save_checkpoint(root: str | os.PathLike, step: int, trainer_state: dict,
                    save_workers: Callable[[Path], None], max_to_keep: int | None = None,
                    keep: Iterable[int] = ()) -> Path:
    """Write ``global_step_<step>`` atomically and point ``latest`` at it.

    Args:
        root: ``trainer.default_local_dir``.
        trainer_state: JSON-serialisable controller state (sampler position, KL coefficient, ...).
        save_workers: writes the workers' parts (actor/, critic/, huggingface/) under the folder given.
        max_to_keep: keep at most this many complete step folders (oldest deleted); None keeps all.
        keep: steps never pruned (the best checkpoint).
    Returns:
        The final folder.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_workers(tmp)
    state = dict(trainer_state, global_step=step, rng=controller_rng_state())
    _write_json_atomic(tmp / STATE_FILE, state)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _write_text_atomic(root / LATEST_FILE, str(step))
    if max_to_keep is not None and max_to_keep > 0:
        prune(root, max_to_keep, keep)
    return final


def discard_partial(root: str | os.PathLike, step: int) -> list[Path]:
    """Delete what an interrupted :func:`save_checkpoint` of ``step`` left under ``root`` (its
    ``.global_step_N.tmp`` folder, a temporary pointer file); call it only once no worker writes
    there any more. Returns what was deleted."""
    root = Path(root)
    partial = [path for path in (root / f".{step_dir(root, step).name}.tmp", root / f"{LATEST_FILE}.tmp")
               if path.exists()]
    for path in partial:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return partial


def prune(root: str | os.PathLike, max_to_keep: int, keep: Iterable[int] = ()) -> list[Path]:
    """Delete the oldest complete checkpoints beyond the newest ``max_to_keep``, except the steps in
    ``keep``; returns the deleted folders."""
    steps = sorted(complete_steps(root))
    kept = set(keep)
    doomed = [step_dir(root, s) for s in steps[:-max_to_keep] if s not in kept] if len(steps) > max_to_keep else []
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def read_best(root: str | os.PathLike) -> dict | None:
    """``{"step", "metric", "value"}`` of the best checkpoint (``trainer.keep_best``), or None when
    none was recorded or its folder is not complete."""
    path = Path(root) / BEST_FILE
    if not path.is_file():
        return None
    best = json.loads(path.read_text())
    return best if is_complete(step_dir(root, int(best["step"]))) else None


def write_best(root: str | os.PathLike, step: int, metric: str, value: float) -> None:
    """Record ``global_step_<step>`` as the best checkpoint by ``metric`` (written atomically)."""
    _write_json_atomic(Path(root) / BEST_FILE, {"step": step, "metric": metric, "value": value})


def complete_steps(root: str | os.PathLike) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and is_complete(child):
            steps.append(int(match.group(1)))
    return steps


def find_latest(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint: the pointer's target if complete, else the highest complete step."""
    root = Path(root)
    pointer = root / LATEST_FILE
    if pointer.is_file():
        text = pointer.read_text().strip()
        if text.isdigit() and is_complete(step_dir(root, int(text))):
            return step_dir(root, int(text))
    steps = complete_steps(root)
    return step_dir(root, max(steps)) if steps else None


def resolve_resume_path(resume_mode: str, root: str | os.PathLike) -> Path | None:
    """Which checkpoint to resume from for ``trainer.resume_mode``.

    ``disable``: none. ``auto``: the latest complete one under ``root`` or none. Anything else is a
    path to a ``global_step_N`` folder.

    Raises:
        ValueError: the given path is not a complete checkpoint folder.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        return find_latest(root)
    path = Path(resume_mode)
    if not is_complete(path):
        raise ValueError(f"trainer.resume_mode={resume_mode!r}: not a complete checkpoint folder "
                         f"(no {STATE_FILE}); expected .../global_step_N written by this trainer")
    return path


def load_trainer_state(path: str | os.PathLike) -> dict:
    """Read ``trainer_state.json`` and restore the controller RNG from it."""
    state = json.loads((Path(path) / STATE_FILE).read_text())
    if "rng" in state:
        restore_controller_rng(state["rng"])
    return state


def _write_json_atomic(path: Path, data: dict) -> None:
    _write_text_atomic(path, json.dumps(data))


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
