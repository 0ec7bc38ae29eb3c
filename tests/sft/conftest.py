"""Shared fixtures for the SFT / LoRA tests: a tiny real-tokenizer model and a small demo file."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from search_r1.envs.search_r1.prompts import format_observation, make_prefix  # noqa: E402


def demo_assistant(query: str, passage: str, answer: str) -> str:
    """A search-then-answer assistant turn in the RL stage's exact format."""
    return (f"<think> I need to look this up. </think>\n<search> {query} </search>"
            + format_observation(f"Doc 1(Title: \"{query.title()}\") {passage}\n")
            + f"<think> The passage says {answer}. </think>\n<answer> {answer} </answer>")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from benchmarks.save_random_model import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny_qwen2"), arch="qwen2")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def demo_jsonl(tmp_path_factory):
    facts = [("capital of france", "Paris is the capital of France.", "Paris"),
             ("largest planet", "Jupiter is the largest planet.", "Jupiter"),
             ("author of hamlet", "Hamlet was written by William Shakespeare.", "William Shakespeare"),
             ("boiling point of water", "Water boils at 100 degrees Celsius.", "100 degrees Celsius")]
    path = tmp_path_factory.mktemp("sft_data") / "train.jsonl"
    with open(path, "w") as handle:
        for i in range(8):
            query, passage, answer = facts[i % len(facts)]
            row = {"messages": [{"role": "user", "content": make_prefix(f"what is the {query}")},
                                {"role": "assistant", "content": demo_assistant(query, passage, answer)}]}
            handle.write(json.dumps(row) + "\n")
    return str(path)
