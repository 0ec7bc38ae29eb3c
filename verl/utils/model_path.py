"""Is a model path loadable? One-line answers before anything heavy starts.

``from_pretrained`` on a missing folder fails deep inside transformers with a long traceback that
never says the folder does not exist (it tries the string as a hub id). The trainer and
``infer.py`` ask :func:`check_model_path` first, so a bad path fails in a second with the key
and what to give instead.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# owner/name as the Hugging Face hub spells repository ids
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_model_path(path: str | None, key: str) -> None:
    """Raise ``ValueError`` naming ``key`` unless ``path`` is a model folder or a usable hub id.

    A folder must hold ``config.json`` (an HF model folder) or a ``*.gguf`` file (read with
    ``gguf_file``). A string of the form ``owner/name`` that is no local folder is a hub id: with
    ``HF_HUB_OFFLINE=1`` it must already be in the local Hugging Face cache.

    Args:
        path: the configured value.
        key: the option or config key it came from, quoted in the message.
    Raises:
        ValueError: empty, a file, a folder without model files, a missing folder, or an
            uncached hub id while offline.
    """
    if not path:
        raise ValueError(f"{key} is empty: give a Hugging Face model folder or a hub id such as Qwen/Qwen2.5-3B")
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file() and not any(local.glob("*.gguf")):
            raise ValueError(f"{key}={path}: this folder has no config.json, so it is not a Hugging Face model "
                             "folder (a training checkpoint's model is global_step_N/huggingface)")
        return
    if local.exists():
        raise ValueError(f"{key}={path}: is a file; give the model's folder")
    if not _HUB_ID.match(path):
        raise ValueError(f"{key}={path}: no such folder; give a Hugging Face model folder "
                         "(e.g. checkpoints/<experiment>/global_step_N/huggingface) or a hub id such as Qwen/Qwen2.5-3B")
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False") and not _cached(path):
        raise ValueError(f"{key}={path}: no such folder, and no hub model of that name in the local Hugging Face "
                         "cache while HF_HUB_OFFLINE=1: download it first (unset HF_HUB_OFFLINE) or give a local folder")


def _cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
