"""Shared fixtures: a real-passage test corpus, real MiniLM/BM25 indexes, real servers on 127.0.0.1.

The corpus is the linked passages of the first NQ and HotpotQA questions of ../shared/data/qa whose
gold answer occurs in them (~400 passages, ~30 s to encode with MiniLM on 2 cores). The built indexes
are cached under ~/.cache/search_r1/test_indexes, keyed by the corpus and by the source of the
builder and encoder, so a code change to either rebuilds them.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import string
import threading
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("SEARCH_R1_SHARED_DATA", REPO.parent / "shared" / "data"))
CORPUS_DIR = DATA / "corpus"
NUM_NQ, NUM_HOTPOT = 50, 25


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def answer_hit(answers: list[str], hits: list[dict]) -> bool:
    """A normalised gold answer occurs as whole tokens in one of the passages."""
    passages = [" " + normalize_answer(h["document"]["contents"]) + " " for h in hits]
    return any(" " + normalize_answer(a) + " " in p for a in answers if normalize_answer(a) for p in passages)


@pytest.fixture(scope="session")
def shared_corpus_dir() -> Path:
    if not CORPUS_DIR.is_dir():
        pytest.skip(f"shared data not found at {DATA}")
    return CORPUS_DIR


@pytest.fixture(scope="session")
def hit_fn():
    """``answer_hit`` as a fixture (test modules here are not an importable package)."""
    return answer_hit


def _read_jsonl(path: Path) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


@pytest.fixture(scope="session")
def qa_subset() -> dict[str, list[dict]]:
    """NQ/HotpotQA questions whose linked passages hold the answer, with those passage ids."""
    if not CORPUS_DIR.is_dir():
        pytest.skip(f"shared data not found at {DATA}")
    nq = [r for r in _read_jsonl(DATA / "qa/nq/test.jsonl")
          if r.get("sr1_retrieved_passage_ids") and r.get("answer_in_linked_passages")][:NUM_NQ]
    hotpot = [r for r in _read_jsonl(DATA / "qa/hotpotqa/dev.jsonl")
              if r.get("context_passage_ids") and r.get("answer_in_linked_passages")][:NUM_HOTPOT]
    for row in nq:
        row["linked"] = row["sr1_retrieved_passage_ids"]
    for row in hotpot:
        row["linked"] = row["context_passage_ids"]
    return {"nq": nq, "hotpotqa": hotpot}


@pytest.fixture(scope="session")
def cache_dir(qa_subset) -> Path:
    """Cache folder keyed by the test corpus and the builder/encoder source code."""
    from verl.utils.model_zoo import cache_root

    wanted = {pid for rows in qa_subset.values() for row in rows for pid in row["linked"]}
    digest = hashlib.sha1(",".join(sorted(wanted)).encode())
    for name in ("index_builder.py", "encoders.py", "bm25.py", "corpus.py"):
        digest.update((REPO / "search_r1/search" / name).read_bytes())
    path = cache_root() / "test_indexes" / digest.hexdigest()[:16]
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def test_corpus(qa_subset, cache_dir) -> Path:
    """JSONL of the linked passages (file order of the shared corpus)."""
    path = cache_dir / "corpus.jsonl"
    if not path.exists():
        wanted = {pid for rows in qa_subset.values() for row in rows for pid in row["linked"]}
        rows = [r for name in ("wiki18_sr1_retrieved.jsonl", "hotpotqa_paragraphs.jsonl")
                for r in _read_jsonl(CORPUS_DIR / name) if r["id"] in wanted]
        assert len(rows) == len(wanted), "linked passages missing from the shared corpus"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.rename(path)
    return path


@pytest.fixture(scope="session")
def dense_index(test_corpus, cache_dir) -> Path:
    """A real MiniLM Flat index of the test corpus (built through the builder's CLI entry)."""
    from search_r1.search import index_builder

    path = cache_dir / "minilm_Flat.index"
    if not path.exists() or not Path(str(path) + ".meta.json").exists():
        index_builder.main(["--retrieval_method", "minilm", "--corpus_path", str(test_corpus),
                            "--save_dir", str(cache_dir), "--batch_size", "32", "--device", "cpu"])
    return path


@pytest.fixture(scope="session")
def bm25_index(test_corpus, cache_dir) -> Path:
    from search_r1.search import index_builder

    path = cache_dir / "bm25"
    if not (path / "search_r1_meta.json").exists():
        index_builder.main(["--retrieval_method", "bm25", "--corpus_path", str(test_corpus),
                            "--save_dir", str(cache_dir)])
    return path


@pytest.fixture(scope="session")
def dense_server(dense_index, test_corpus):
    from search_r1.search.launcher import launch_server

    with launch_server(["--index_path", str(dense_index), "--corpus_path", str(test_corpus),
                        "--retriever_name", "minilm", "--topk", "3", "--max_topk", "50",
                        "--max_queries", "64", "--max_body_bytes", "65536"]) as server:
        yield server


@pytest.fixture(scope="session")
def bm25_server(bm25_index, test_corpus):
    from search_r1.search.launcher import launch_server

    with launch_server(["--index_path", str(bm25_index), "--corpus_path", str(test_corpus),
                        "--retriever_name", "bm25", "--topk", "3"]) as server:
        yield server


class ScriptedHandler(http.server.BaseHTTPRequestHandler):
    """A real HTTP peer whose answers a test scripts (``server.script(handler, body)``)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.calls.append(body)
        self.server.script(self, body)

    def do_GET(self):
        self.server.calls.append(self.path.encode())
        self.server.script(self, b"")

    def send_json(self, status: int, payload, content_type: str = "application/json"):
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture
def scripted_server():
    """Start a threaded HTTP server on 127.0.0.1 running a given script; yields a starter."""
    servers = []

    def start(script):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ScriptedHandler)
        server.daemon_threads = True
        server.script, server.calls = script, []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        server.url = f"http://127.0.0.1:{server.server_address[1]}"
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def example_bm25(tmp_path_factory) -> tuple[Path, Path]:
    """A BM25 index of the repo's own ``example/corpus.jsonl`` (seconds to build; no shared data)."""
    from search_r1.search import index_builder

    corpus = REPO / "example" / "corpus.jsonl"
    save_dir = tmp_path_factory.mktemp("example_bm25")
    index_builder.main(["--retrieval_method", "bm25", "--corpus_path", str(corpus), "--save_dir", str(save_dir)])
    return save_dir / "bm25", corpus


EXAMPLE_DENSE_PASSAGES = 256


@pytest.fixture(scope="session")
def example_dense(tmp_path_factory) -> tuple[Path, Path]:
    """A MiniLM Flat index of the first 256 passages of ``example/corpus.jsonl`` (seconds to encode;
    no shared data): ``(index file, corpus file)``."""
    from search_r1.search import index_builder

    save_dir = tmp_path_factory.mktemp("example_dense")
    corpus = save_dir / "corpus.jsonl"
    with open(REPO / "example" / "corpus.jsonl") as handle:
        corpus.write_text("".join(line for _, line in zip(range(EXAMPLE_DENSE_PASSAGES), handle)))
    index_builder.main(["--retrieval_method", "minilm", "--corpus_path", str(corpus), "--save_dir", str(save_dir),
                        "--batch_size", "32", "--device", "cpu"])
    return save_dir / "minilm_Flat.index", corpus
