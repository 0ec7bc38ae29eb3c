"""Every documented way to start the server serves ``/retrieve``: ``python -m``, and Search-R1's
script form under both of its names (``retrieval_server.py``, ``retriever_server.py``)."""

import sys

import httpx
import pytest

from search_r1.search.launcher import launch_server

from conftest import REPO

FORMS = {
    "module": [sys.executable, "-m", "search_r1.search.retrieval_server"],
    "script": [sys.executable, str(REPO / "search_r1/search/retrieval_server.py")],
    "script_alias": [sys.executable, str(REPO / "search_r1/search/retriever_server.py")],
    "module_alias": [sys.executable, "-m", "search_r1.search.retriever_server"],
}


@pytest.mark.parametrize("form", FORMS)
def test_start_forms_serve_retrieve(form, example_bm25):
    index, corpus = example_bm25
    # No PYTHONPATH for the script forms: a fresh clone started as Search-R1's README does.
    env = {"PYTHONPATH": ""} if form.startswith("script") else None
    with launch_server(["--index_path", str(index), "--corpus_path", str(corpus), "--topk", "3",
                        "--retriever_name", "bm25"], command=FORMS[form], env=env, startup_timeout=120) as server:
        hits = httpx.post(server.retrieve_url, json={"queries": ["Hiccup How to Train Your Dragon 2"]},
                          timeout=60).json()["result"][0]
        assert len(hits) == 3 and all(set(h["document"]) == {"id", "contents"} for h in hits)
