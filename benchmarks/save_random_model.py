"""Save a randomly initialised Qwen2.5-shaped model as an HF folder the trainer can load (issue 7).

    python benchmarks/save_random_model.py --shape qwen2.5-0.5b --tokenizer <hf folder> --out /tmp/q05

The weights are random (no download); the tokenizer is borrowed from ``--tokenizer`` (e.g. the
SmolLM2 folder: its 49k ids fit the 151,936-row Qwen embedding). Throughput does not depend on the
weight values, but a random policy never closes a tag, so every generation runs to its length limit:
whole-step timings measured with it are the worst case for generation length.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.shapes import SHAPES, build_random_model, get_shape  # noqa: E402
from verl.utils import model_zoo  # noqa: E402


def build_tiny_causal_lm(save_dir: str | os.PathLike, arch: str = "qwen2", hidden_size: int = 128,
                         num_layers: int = 2, num_heads: int = 2, num_kv_heads: int = 1,
                         intermediate_size: int = 256, tokenizer_dir: str | None = None,
                         seed: int = 0) -> str:
    """Save a small random-init causal LM with a real tokenizer (tests and CPU benchmarks; no weights needed).

    The default head dimension is 64 because the vLLM CPU attention kernels accept only a few head
    sizes (16, for instance, is refused), and the tests run this model in vLLM too.

    Args:
        save_dir: output folder (created); reused when it already holds a model.
        arch: ``"qwen2"`` or ``"llama"``.
        tokenizer_dir: tokenizer to ship with the model (default: the Qwen tokenizer).
    Returns:
        ``save_dir`` as a string, loadable with ``AutoModelForCausalLM.from_pretrained``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config

    save_dir = Path(save_dir)
    if (save_dir / "model.safetensors").exists():
        return str(save_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or model_zoo.qwen_tokenizer_dir())
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    config_cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch]
    config = config_cls(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size, max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(save_dir, safe_serialization=True)
    tokenizer.save_pretrained(save_dir)
    return str(save_dir)


def save_random_model(shape_name: str, tokenizer_path: str, out_dir: str, dtype: str = "bfloat16") -> str:
    """Write config, bf16 safetensors and the borrowed tokenizer to ``out_dir``; returns the folder.

    Raises:
        ValueError: unknown shape, or a tokenizer with more ids than the shape's vocabulary.
    """
    import torch
    from transformers import AutoTokenizer

    shape = get_shape(shape_name)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    if len(tokenizer) > shape.vocab_size:
        raise ValueError(f"tokenizer {tokenizer_path} has {len(tokenizer)} ids > vocab {shape.vocab_size}")
    # initialised on the GPU where there is one: a 3B shape's bf16 init takes ~2.5 min on 16 CPU cores
    model = build_random_model(shape, getattr(torch, dtype), "cuda" if torch.cuda.is_available() else "cpu")
    # Stop tokens follow the borrowed tokenizer, so generation config and chat template agree.
    for key in ("eos_token_id", "pad_token_id", "bos_token_id"):
        value = getattr(tokenizer, key)
        if value is not None:
            setattr(model.config, key, value)
            setattr(model.generation_config, key, value)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    print(save_random_model(args.shape, args.tokenizer, args.out, args.dtype))


if __name__ == "__main__":
    main()
