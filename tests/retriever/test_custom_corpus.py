"""docs/quickstart.md's custom-corpus route: corpus JSONL -> build_index.sh -> retrieval_launch.sh."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from search_r1.search.launcher import launch_server

REPO = Path(__file__).resolve().parents[2]
PASSAGES = [("Hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600."),
            ("Apollo 11", "Apollo 11 was the spaceflight that first landed humans on the Moon in July 1969."),
            ("Canberra", "Canberra is the capital city of Australia, in the Australian Capital Territory.")]


def test_corpus_to_index_to_server(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n"
                              for i, (t, x) in enumerate(PASSAGES)))
    env = {**os.environ, "CORPUS_FILE": str(corpus), "SAVE_DIR": str(tmp_path / "indexes"), "RETRIEVER_NAME": "bm25",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    subprocess.run(["bash", str(REPO / "search_r1/search/build_index.sh")], env=env, check=True, cwd=tmp_path,
                   capture_output=True, timeout=300)
    assert (tmp_path / "indexes/bm25/search_r1_meta.json").exists()
    launch_env = {"INDEX": str(tmp_path / "indexes/bm25"), "CORPUS": str(corpus), "RETRIEVER": "bm25",
                  "FAISS_GPU": "0", "PATH": env["PATH"]}
    with launch_server([], command=["bash", str(REPO / "retrieval_launch.sh")], env=launch_env) as server:
        hits = httpx.post(server.retrieve_url, json={"queries": ["capital of Australia"], "topk": 1},
                          timeout=60).json()["result"][0]
    assert hits[0]["document"] == {"id": "2", "contents": '"Canberra"\n' + PASSAGES[2][1]}


def test_build_index_names_a_missing_corpus(tmp_path):
    env = {**os.environ, "CORPUS_FILE": str(tmp_path / "nope.jsonl"), "SAVE_DIR": str(tmp_path)}
    result = subprocess.run(["bash", str(REPO / "search_r1/search/build_index.sh")], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "corpus not found: " + str(tmp_path / "nope.jsonl") in result.stderr
