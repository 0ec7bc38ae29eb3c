"""Where a started retrieval server's log goes: beside a run's outputs, or nowhere after a clean stop.

Each test starts a real server (BM25 over a three-passage corpus) on 127.0.0.1; the system temp
folder is redirected to the test's own folder, so a leftover ``retrieval_server_*.log`` is seen.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from search_r1.search.launcher import free_port, launch_server

REPO = Path(__file__).resolve().parents[2]
PASSAGES = ['"Eiffel Tower"\nThe Eiffel Tower in Paris was completed in 1889.',
            '"Canberra"\nCanberra is the capital city of Australia.',
            '"Jupiter"\nJupiter is the largest planet in the Solar System.']


@pytest.fixture
def bm25(tmp_path) -> tuple[Path, Path]:
    """``(corpus.jsonl, index folder)`` built with the project's index builder."""
    import subprocess

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": p}) + "\n" for i, p in enumerate(PASSAGES)))
    subprocess.run([sys.executable, "-m", "search_r1.search.index_builder", "--retrieval_method", "bm25",
                    "--corpus_path", str(corpus), "--save_dir", str(tmp_path / "index")], check=True,
                   capture_output=True)
    return corpus, tmp_path / "index"


@pytest.fixture
def temp_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "system_tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _server_args(corpus: Path, index: Path) -> list[str]:
    return ["--retriever_name", "bm25", "--index_path", str(index / "bm25"), "--corpus_path", str(corpus)]


def _search(url: str) -> list:
    return httpx.post(url, json={"queries": ["eiffel tower"], "topk": 1}, timeout=10).json()["result"]


def test_temporary_log_is_removed_after_a_clean_stop(bm25, temp_dir):
    with launch_server(_server_args(*bm25), startup_timeout=120) as server:
        assert Path(server.log_path).parent == temp_dir and Path(server.log_path).is_file()
        assert _search(server.retrieve_url)[0][0]["document"]["id"] == "0"
    assert list(temp_dir.iterdir()) == []


def test_named_log_is_kept(bm25, temp_dir, tmp_path):
    log = tmp_path / "run" / "logs" / "retrieval_server.log"
    with launch_server(_server_args(*bm25), startup_timeout=120, log_path=log):
        pass
    assert log.is_file() and list(temp_dir.iterdir()) == []


def test_a_server_that_fails_keeps_its_log_and_names_it(tmp_path, temp_dir):
    with pytest.raises(RuntimeError, match="retrieval server exited with") as error:
        launch_server(["--retriever_name", "bm25", "--index_path", str(tmp_path / "missing"),
                       "--corpus_path", str(tmp_path / "missing.jsonl")], startup_timeout=120)
    (log,) = temp_dir.iterdir()
    assert f"(log: {log})" in str(error.value)


def test_quickstart_puts_the_log_beside_the_run(bm25, temp_dir, tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    import quickstart

    corpus, index = bm25
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    from verl.trainer.main_ppo import parse_config

    args, overrides = quickstart.parse_args(["--corpus", str(corpus), "--index-dir", str(index), "--retriever-url",
                                             url, f"trainer.default_local_dir={tmp_path / 'run'}"])
    out = quickstart.run_output_dir(parse_config(overrides))
    assert out == tmp_path / "run"
    with quickstart.local_retriever(args, out / "logs" / "retrieval_server.log"):
        assert _search(url)
    assert (tmp_path / "run" / "logs" / "retrieval_server.log").is_file()
    assert list(temp_dir.iterdir()) == []
    relative = parse_config(["trainer.experiment_name=mine", "trainer.default_local_dir=checkpoints/${.experiment_name}"])
    assert quickstart.run_output_dir(relative) == REPO / "checkpoints" / "mine"  # as the train scripts set it
