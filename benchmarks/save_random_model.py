"""Save a randomly initialised Qwen2.5-shaped model as an HF folder the trainer can load (issue 7).

    python benchmarks/save_random_model.py --shape qwen2.5-0.5b --tokenizer <hf folder> --out /tmp/q05

The weights are random (no download); the tokenizer is borrowed from ``--tokenizer`` (e.g. the
SmolLM2 folder: its 49k ids fit the 151,936-row Qwen embedding). Throughput does not depend on the
weight values, but a random policy never closes a tag, so every generation runs to its length limit:
whole-step timings measured with it are the worst case for generation length.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.shapes import SHAPES, build_random_model, get_shape  # noqa: E402


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
    model = build_random_model(shape, getattr(torch, dtype), "cpu")
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
