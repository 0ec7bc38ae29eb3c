"""Shared fixtures: SmolLM2 (pad == eos), a real BM25 retriever server, the two engines, the modes.

Tests that take ``mode`` run once per rollout mode; the async runs carry ``async`` in their ids
(``test_x[async]``), so ``pytest -k async`` selects them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from verl.utils.model_zoo import smollm2_dir
    return smollm2_dir()


MODES = ("sync", "async")


@pytest.fixture(params=MODES)
def mode(request) -> str:
    """The rollout mode (``LoopConfig.mode``): every test taking it runs in both."""
    return request.param


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen2.5/Qwen3 BPE tokenizer (merges ``>.``, ``>\n``, ``>\n\n``)."""
    from transformers import AutoTokenizer

    from verl.utils.model_zoo import qwen_tokenizer_dir
    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir())


@pytest.fixture(scope="session")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(smollm2_path)


def build_bm25_index(corpus: str, save_dir: str) -> str:
    """Build the BM25 index in a child process, as a user's retrieval_launch.sh does."""
    import subprocess
    import sys
    subprocess.run([sys.executable, "-m", "search_r1.search.index_builder", "--retrieval_method", "bm25",
                    "--corpus_path", corpus, "--save_dir", save_dir], check=True, capture_output=True)
    return str(Path(save_dir) / "bm25")


@pytest.fixture(scope="session")
def retriever_server(tmp_path_factory):
    """A real retrieval server (BM25 over the example corpus) on 127.0.0.1."""
    from search_r1.search.launcher import launch_server

    corpus = str(REPO / "example" / "corpus.jsonl")
    index_dir = build_bm25_index(corpus, str(tmp_path_factory.mktemp("bm25")))
    server = launch_server(["--retriever_name", "bm25", "--index_path", index_dir, "--corpus_path", corpus],
                           startup_timeout=120)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def retriever(retriever_server):
    from search_r1.search.client import RetrieverClient
    return RetrieverClient(retriever_server.retrieve_url, topk=2, timeout=10.0, max_retries=1)


@pytest.fixture(scope="session")
def hf_engine(smollm2_path, tokenizer):
    from verl.workers.rollout.hf_rollout import HFRolloutEngine
    return HFRolloutEngine(tokenizer, model_path=smollm2_path)


@pytest.fixture(scope="session")
def vllm_engine(smollm2_path, tokenizer):
    """One in-process vLLM engine for the whole session (construction costs ~10 s).

    bm25s is imported first on purpose: it loads llvmlite, whose ``ffi.lib`` broke vLLM-CPU's
    kernel scan until the engine learned to hide it (vllm_rollout._hidden_from_kernel_scan); the
    retriever tests import it into this same pytest process anyway.
    """
    import bm25s  # noqa: F401
    from verl.workers.rollout import build_rollout_engine
    return build_rollout_engine({"name": "vllm", "dtype": "float32", "max_model_len": 1024,
                                 "kv_cache_space_gib": 1}, smollm2_path, tokenizer)


@pytest.fixture(scope="session")
def long_context_vllm_engine(smollm2_path, tokenizer):
    """A vLLM engine whose length the trainer would derive for ``test_long_context.DATA``."""
    import bm25s  # noqa: F401
    from tests.rollout.test_long_context import DATA
    from verl.workers.rollout import build_rollout_engine
    from verl.workers.rollout.config import RolloutConfig, engine_max_model_len

    config = RolloutConfig(name="vllm", dtype="float32", kv_cache_space_gib=0.5)
    return build_rollout_engine(config, smollm2_path, tokenizer, max_model_len=engine_max_model_len(config, DATA))


def chat_prompt(tokenizer, question: str, assistant_prefix: str = "") -> list[int]:
    """Search-R1 prompt for ``question`` with the chat template, plus a forced assistant prefix."""
    from search_r1.envs.search_r1.prompts import make_prefix
    text = tokenizer.apply_chat_template([{"role": "user", "content": make_prefix(question)}],
                                         tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text + assistant_prefix, add_special_tokens=False)
