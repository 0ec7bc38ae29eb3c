"""Fixtures of the trainer tests: a tiny real-tokenizer model, Search-R1 parquet data, a real
retriever server on 127.0.0.1 over a small corpus, and a runner for the real entry point."""

from __future__ import annotations

import json
import socket
import sys
import urllib.request

import pytest

from .helpers import REPO, run_main, tiny_overrides

# Real NQ-open questions (dev set) with their gold answers, and short passages that answer them.
QA = [
    ("who got the first nobel prize in physics", ["Wilhelm Conrad Röntgen"]),
    ("when was the eiffel tower completed", ["1889"]),
    ("who wrote the novel pride and prejudice", ["Jane Austen"]),
    ("what is the capital city of australia", ["Canberra"]),
    ("how many players are on a baseball team on the field", ["nine", "9"]),
    ("who painted the mona lisa", ["Leonardo da Vinci"]),
    ("what is the largest planet in the solar system", ["Jupiter"]),
    ("who was the first president of the united states", ["George Washington"]),
]
CORPUS = [
    '"Nobel Prize in Physics"\nThe first Nobel Prize in Physics was awarded in 1901 to Wilhelm Conrad Röntgen for the discovery of X-rays.',
    '"Eiffel Tower"\nThe Eiffel Tower in Paris was completed in 1889 as the entrance arch of the World\'s Fair.',
    '"Pride and Prejudice"\nPride and Prejudice is an 1813 novel of manners written by Jane Austen.',
    '"Canberra"\nCanberra is the capital city of Australia, located in the Australian Capital Territory.',
    '"Baseball"\nBaseball is played between two teams of nine players each, who take turns batting and fielding.',
    '"Mona Lisa"\nThe Mona Lisa is a half-length portrait painting by the Italian artist Leonardo da Vinci.',
    '"Jupiter"\nJupiter is the fifth planet from the Sun and the largest in the Solar System.',
    '"George Washington"\nGeorge Washington was the first president of the United States, serving from 1789 to 1797.',
]


def _row(question: str, answers: list[str], index: int, split: str) -> dict:
    from search_r1.envs.search_r1.prompts import make_prefix

    return {"data_source": "nq", "prompt": [{"role": "user", "content": make_prefix(question)}],
            "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
            "extra_info": {"split": split, "index": index}}


@pytest.fixture(scope="session")
def qa_parquet(tmp_path_factory) -> dict[str, str]:
    """``{"train": path, "test": path}``: 6 training and 4 test rows in Search-R1's schema."""
    import pandas as pd

    root = tmp_path_factory.mktemp("qa")
    paths = {}
    for split, rows in (("train", QA[:6]), ("test", QA[4:])):
        frame = pd.DataFrame([_row(q, a, i, split) for i, (q, a) in enumerate(rows)])
        paths[split] = str(root / f"{split}.parquet")
        frame.to_parquet(paths[split])
    return paths


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    body = json.dumps({"queries": ["eiffel tower"], "topk": 1, "return_scores": False}).encode()
    try:
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def retriever_url(tmp_path_factory) -> str:
    """A real BM25 retrieval server on 127.0.0.1 (started through the quickstart's own code path)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import quickstart

    root = tmp_path_factory.mktemp("corpus")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(CORPUS)))
    url = f"http://127.0.0.1:{_free_port()}/retrieve"
    args, _ = quickstart.parse_args(["--corpus", str(corpus), "--index-dir", str(root / "bm25"),
                                     "--retriever-url", url])
    with quickstart.local_retriever(args):
        assert _answers(url)
        yield url


def straight_run_overrides(model: str, data: dict, url: str, out) -> list[str]:
    """The 4-step GRPO run (local backend, saved at steps 2 and 4 with the HF export) of
    :func:`straight_run`; a test that kills and resumes the same command compares against it."""
    return tiny_overrides(model, data, url, out, "grpo") + [
        "trainer.backend=local", "trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.export_hf=true"]


@pytest.fixture(scope="session")
def straight_run(tiny_qwen_path, qa_parquet, retriever_url, tmp_path_factory):
    """``(overrides, folder)``: one finished run of :func:`straight_run_overrides`, shared (read only) by
    the resume test (its reference) and the rerun refusal (a run whose target step is reached)."""
    out = tmp_path_factory.mktemp("straight_run") / "run"
    overrides = straight_run_overrides(tiny_qwen_path, qa_parquet, retriever_url, out)
    result = run_main(overrides)
    assert result.returncode == 0, result.stdout[-3000:] + "\n" + result.stderr[-5000:]
    return overrides, out
