"""What the real server entry point says when it starts, and when it cannot: a start-up line naming
what it serves, or one line naming the culprit with exit code 2 (a missing API key, a missing model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from search_r1.search.launcher import free_port, launch_server

REPO = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, "-m", "search_r1.search.retrieval_server"]
WEB_KEYS = ("GOOGLE_API_KEY", "GOOGLE_CSE_ID")


def _run(args: list[str], command: list[str] = SERVER, **env) -> subprocess.CompletedProcess:
    """The server run to completion (it must exit by itself) with ``env`` over a clean environment."""
    child_env = {k: v for k, v in os.environ.items() if k not in WEB_KEYS and k not in env}
    child_env.update({k: v for k, v in env.items() if v is not None})
    child_env["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return subprocess.run([*command, *args, "--port", str(free_port())], capture_output=True, text=True,
                          env=child_env, timeout=300, cwd=REPO)


def _one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def test_web_backend_without_its_key_is_one_line():
    line = _one_line(_run(["--retriever_name", "google"]))
    assert "--retriever_name google needs an API key" in line and "$GOOGLE_API_KEY" in line
    line = _one_line(_run(["--retriever_name", "google"], GOOGLE_API_KEY="k"))
    assert "search engine id" in line and "--cse_id" in line and "$GOOGLE_CSE_ID" in line


def test_missing_reranker_offline_is_one_line(example_bm25, tmp_path):
    index, corpus = example_bm25
    first_stage = ["--retriever_name", "bm25", "--index_path", str(index), "--corpus_path", str(corpus)]
    missing = tmp_path / "no_such_reranker"
    line = _one_line(_run([*first_stage, "--reranker_model", str(missing)], HF_HUB_OFFLINE="1"))
    assert f"--reranker_model {missing}: no such folder" in line and "build_reranker.py" in line
    line = _one_line(_run([*first_stage, "--reranker_model", "no-such-reranker"], HF_HUB_OFFLINE="1"))
    assert "--reranker_model no-such-reranker: no such folder, not in the Hugging Face cache" in line
    assert "$HF_HUB_OFFLINE is set" in line
    # A hub id, not cached, with the hub unreachable and no offline variable set: one connection
    # attempt, not transformers' minute of retries.
    endpoint = f"http://127.0.0.1:{free_port()}"
    line = _one_line(_run([*first_stage, "--reranker_model", "cross-encoder/ms-marco-MiniLM-L12-v2"],
                          HF_HUB_OFFLINE=None, TRANSFORMERS_OFFLINE=None, HF_ENDPOINT=endpoint,
                          HF_HOME=str(tmp_path / "hf_home")))
    assert "--reranker_model cross-encoder/ms-marco-MiniLM-L12-v2" in line and endpoint in line
    # The documented example command says the same.
    script = ["bash", str(REPO / "example/retriever/serve_reranked.sh")]
    line = _one_line(_run([], command=script, INDEX=str(index), CORPUS=str(corpus), RETRIEVER="bm25",
                          FAISS_GPU="0", RERANKER=str(missing), HF_HUB_OFFLINE="1",
                          PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]))
    assert f"--reranker_model {missing}" in line


def _startup_lines(server) -> list[str]:
    return [line for line in server.log_tail(20000).splitlines() if line.startswith("retrieval server:")]


def test_startup_line_names_index_corpus_address_and_device(example_bm25, example_dense):
    index, corpus = example_bm25
    with launch_server(["--retriever_name", "bm25", "--index_path", str(index), "--corpus_path", str(corpus)],
                       startup_timeout=120) as server:
        (line,) = _startup_lines(server)
        assert line == (f"retrieval server: bm25 index {index}, corpus {corpus} (1168 passages) on {server.url}, "
                        f"device cpu")
    index, corpus = example_dense
    with launch_server(["--retriever_name", "minilm", "--index_path", str(index), "--corpus_path", str(corpus)],
                       startup_timeout=300) as server:
        (line,) = _startup_lines(server)
        size = httpx.get(server.url + "/health").json()["index_size"]
        assert line == (f"retrieval server: dense Flat index {index}, corpus {corpus} ({size} passages) on "
                        f"{server.url}, device encoder cpu, search cpu")
    search_url = f"http://127.0.0.1:{free_port()}/res/v1/web/search"  # not called at start
    with launch_server(["--retriever_name", "brave", "--api_key", "k", "--search_url", search_url],
                       startup_timeout=120) as server:
        (line,) = _startup_lines(server)
        assert line == (f"retrieval server: brave web search {search_url} (snippet_only) on {server.url}, "
                        f"device none (remote API)")
