"""Fixtures of the trainer tests: a tiny real-tokenizer model, Search-R1 parquet data, a real
retriever server on 127.0.0.1 over a small corpus, and a runner for the real entry point."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

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
    from search_r1.prompts import make_prefix

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


def run_main(overrides: list[str], timeout: int = 600, **popen) -> subprocess.CompletedProcess:
    """``python -m verl.trainer.main_ppo`` with overrides, as a user runs it."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, **popen)


def tiny_overrides(model: str, data: dict, url: str, out: Path, algo: str) -> list[str]:
    """A complete, tiny run: 1 rank, short turns, batch of 3 prompts."""
    common = [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={data['train']}", f"data.val_files={data['test']}",
        f"retriever.url={url}", f"trainer.default_local_dir={out}", "trainer.n_gpus_per_node=1",
        "data.train_batch_size=3", "data.val_batch_size=4", "data.max_prompt_length=768", "data.max_start_length=256",
        "data.max_response_length=12", "data.max_obs_length=64", "max_turns=2",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.actor.ppo_micro_batch_size=3",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size=6", "actor_rollout_ref.ref.log_prob_micro_batch_size=6",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false", "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.actor.fsdp_config.param_offload=false", "actor_rollout_ref.actor.fsdp_config.grad_offload=false",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false", "actor_rollout_ref.ref.fsdp_config.param_offload=false",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32", "trainer.logger=[console,jsonl]",
        "trainer.val_before_train=false", "trainer.test_freq=-1",
    ]
    if algo == "grpo":
        return common + ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
                         "algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.use_kl_loss=true"]
    return common + [
        "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true", "critic.ppo_micro_batch_size=3",
        "critic.optim.lr=1e-3", "critic.optim.lr_warmup_steps_ratio=0.0",
        "critic.model.enable_gradient_checkpointing=false", "critic.model.use_remove_padding=false",
        "critic.model.fsdp_config.param_offload=false", "critic.model.fsdp_config.grad_offload=false",
        "critic.model.fsdp_config.optimizer_offload=false", "critic.model.fsdp_config.mixed_precision=fp32"]


def read_metrics(out: Path) -> list[dict]:
    path = Path(out) / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited early with code {proc.returncode}")
        if time.time() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.2)
