"""The cross-encoder reranker: scoring, the reranked retriever, and the server started by its
documented command (``example/retriever/serve_reranked.sh``) behind BM25 and behind a web backend.

The reranker is a real fine-tune of the shipped MiniLM weights by ``scripts/build_reranker.py``,
shortened to fit a test on 2 CPU cores (gold-labelled training questions only, a few dozen steps), on
the shared data or, without them, on the repo's example/ data, cached under
``~/.cache/search_r1/test_reranker`` keyed by the data, the recipe and the builder's and reranker's source.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from search_r1.search.launcher import launch_server

REPO = Path(__file__).resolve().parents[2]
TEST_STEPS = 40
sys.path.insert(0, str(REPO / "scripts"))


@pytest.fixture(scope="session")
def small_reranker() -> str:
    import build_reranker

    from verl.utils.model_zoo import cache_root

    data = build_reranker.find_training_data()
    recipe = build_reranker.Recipe(max_steps=TEST_STEPS, num_weak_questions=0, groups_per_step=4, group_size=4,
                                   random_negatives=1, max_length=128)  # easy negatives: some signal within 40 steps
    digest = hashlib.sha1((data.source + repr(recipe)).encode())
    for path in (REPO / "scripts/build_reranker.py", REPO / "search_r1/search/reranker.py"):
        digest.update(path.read_bytes())
    target = cache_root() / "test_reranker" / f"{digest.hexdigest()[:16]}-{TEST_STEPS}"
    if not (target / "search_r1_reranker.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        build_reranker.build(target, recipe, data)
    return str(target)


def test_scores_do_not_depend_on_batching(small_reranker):
    from search_r1.search.reranker import CrossEncoderReranker

    queries = ["who wrote hamlet", "moon landing year", "who wrote hamlet"]
    passages = ['(Title: "Hamlet") Hamlet is a tragedy by William Shakespeare.',
                '(Title: "Apollo 11") Apollo 11 landed on the Moon in July 1969.',
                '(Title: "Apollo 11") Apollo 11 landed on the Moon in July 1969.']
    one = CrossEncoderReranker(small_reranker, device="cpu", batch_size=1).score(queries, passages)
    many = CrossEncoderReranker(small_reranker, device="cpu", batch_size=32).score(queries, passages)
    assert one.shape == (3,) and one.dtype == np.float32
    np.testing.assert_allclose(one, many, atol=1e-4)
    with pytest.raises(ValueError, match="3 queries for 2 passages"):
        CrossEncoderReranker(small_reranker, device="cpu").score(queries, passages[:2])


def test_two_label_models_score_log_odds_and_more_labels_are_refused(tmp_path):
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from search_r1.search.reranker import CrossEncoderReranker
    from verl.utils.model_zoo import minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    for labels in (2, 3):  # small random BERTs: only the head's shape matters here
        config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                            num_attention_heads=2, intermediate_size=64, num_labels=labels)
        BertForSequenceClassification(config).save_pretrained(tmp_path / str(labels))
        tokenizer.save_pretrained(tmp_path / str(labels))
    reranker = CrossEncoderReranker(str(tmp_path / "2"), device="cpu")
    inputs = reranker.tokenizer(["q"], ["some passage"], return_tensors="pt")
    with torch.inference_mode():
        logits = reranker.model(**inputs).logits[0]
    assert reranker.score(["q"], ["some passage"])[0] == pytest.approx(float(logits[1] - logits[0]), abs=1e-5)
    with pytest.raises(ValueError, match="3 labels"):
        CrossEncoderReranker(str(tmp_path / "3"), device="cpu")


def test_reranked_retriever_orders_candidates_by_score(small_reranker, example_bm25):
    from search_r1.search.loading import load_bm25_retriever
    from search_r1.search.reranker import CrossEncoderReranker, RerankedRetriever, pair_text

    index, corpus = example_bm25
    first = load_bm25_retriever(str(index), str(corpus))
    reranker = CrossEncoderReranker(small_reranker, device="cpu")
    retriever = RerankedRetriever(first, reranker, retrieval_topk=10)
    queries = ["who voices hiccup in how to train your dragon 2", "capital of australia"]
    timings: dict = {}
    results = retriever.search(queries, topk=3, timings=timings)
    candidates = first.search(queries, 10)
    assert timings["rerank_s"] > 0
    for query, hits, cands in zip(queries, results, candidates):
        assert len(hits) == 3
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)
        by_id = {c["document"]["id"]: c["document"] for c in cands}
        assert all(h["document"] == by_id[h["document"]["id"]] for h in hits)
        expected = reranker.score([query] * 10, [pair_text(c["document"]["contents"]) for c in cands])
        assert scores[0] == pytest.approx(float(expected.max()), abs=1e-4)


def test_fine_tune_ranks_held_out_gold_above_distractors(small_reranker, shared_corpus_dir):
    """On HotpotQA dev questions (never trained on), even the 40-step fine-tune puts a supporting
    paragraph first among the question's gold + distractor paragraphs more often than chance does:
    above the chance count plus two of its standard deviations (a random ranker passes ~2% of the time)."""
    import json

    from search_r1.search.reranker import CrossEncoderReranker, pair_text

    corpus = {}
    for line in open(shared_corpus_dir / "hotpotqa_paragraphs.jsonl"):
        row = json.loads(line)
        corpus[row["id"]] = row["contents"]
    rows = [json.loads(line) for line in open(shared_corpus_dir.parent / "qa/hotpotqa/dev.jsonl")]
    rows = [r for r in rows if r.get("gold_passage_ids")][:60]
    reranker = CrossEncoderReranker(small_reranker, device="cpu")
    top1, chance, variance = 0, 0.0, 0.0
    for row in rows:
        ids = row["context_passage_ids"]
        scores = reranker.score([row["question"]] * len(ids), [pair_text(corpus[p]) for p in ids])
        top1 += ids[int(scores.argmax())] in row["gold_passage_ids"]
        p_gold = len(row["gold_passage_ids"]) / len(ids)
        chance, variance = chance + p_gold, variance + p_gold * (1 - p_gold)
    assert top1 > chance + 2 * variance ** 0.5, (top1, chance, variance ** 0.5)


def _env(**extra) -> dict:
    return {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def test_documented_command_serves_reranked_results(small_reranker, example_bm25):
    index, corpus = example_bm25
    env = _env(INDEX=str(index), CORPUS=str(corpus), RETRIEVER="bm25", FAISS_GPU="0", RERANKER=small_reranker)
    command = ["bash", str(REPO / "example/retriever/serve_reranked.sh")]
    with launch_server([], command=command, env=env, startup_timeout=120) as server:
        health = httpx.get(server.url + "/health").json()
        assert health["reranker"]["model"] == small_reranker and health["reranker"]["device"] == "cpu"
        assert health["reranker"]["retrieval_topk"] == 10 and health["max_topk"] == 10
        assert health["default_topk"] == 3 and health["kind"] == "bm25"
        response = httpx.post(server.retrieve_url, json={"queries": ["capital of australia"], "return_scores": True},
                              timeout=60)
        hits = response.json()["result"][0]
        assert len(hits) == 3 and [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
        too_many = httpx.post(server.retrieve_url, json={"queries": ["x"], "topk": 11}, timeout=60)
        assert too_many.status_code == 422 and "retrieval_topk" in too_many.json()["detail"]

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=120) as client:
                answers = await asyncio.gather(*(client.post(server.retrieve_url, json={"queries": [f"river {i}"]})
                                                 for i in range(16)))
            return [a.status_code for a in answers]

        assert asyncio.run(burst()) == [200] * 16
        stats = httpx.get(server.url + "/stats").json()
        assert stats["rerank_s"] > 0 and stats["max_batch_queries_seen"] >= 2  # requests shared forwards


def test_reranker_behind_a_web_backend(small_reranker, scripted_server):
    from test_web_backends import PATHS, provider

    api = scripted_server(provider("brave"))
    api.requests = []
    env = _env(BRAVE_API_KEY="test-key", SEARCH_URL=api.url + PATHS["brave"])
    command = ["bash", str(REPO / "example/retriever/serve_brave.sh")]
    with launch_server(["--reranker_model", small_reranker, "--retrieval_topk", "6"], command=command, env=env,
                       startup_timeout=120) as server:
        hits = httpx.post(server.retrieve_url, json={"queries": ["moon"], "return_scores": True},
                          timeout=60).json()["result"][0]
        assert len(hits) == 3 and all(h["document"]["contents"].startswith('"moon result') for h in hits)
        assert api.requests[0]["params"]["count"] == ["6"]  # the candidates come from the web API


def test_without_shared_data_the_example_builds_from_example_data(tmp_path, example_bm25):
    """The documented build command with no shared data trains on example/ and says so; the example
    serve script without RERANKER then serves that model (here a 1-step build, found in the cache)."""
    from search_r1.search.reranker import CrossEncoderReranker

    import build_reranker

    empty, cache = tmp_path / "no_shared_data", tmp_path / "cache"
    empty.mkdir()
    env = {**os.environ, "SEARCH_R1_SHARED_DATA": str(empty), "SEARCH_R1_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    target = cache / "reranker" / f"{build_reranker.RERANKER_NAME}-example"
    build = subprocess.run([sys.executable, str(REPO / "scripts/build_reranker.py"), "--output", str(target),
                            "--max_steps", "1"], capture_output=True, text=True, env=env, timeout=900)
    assert build.returncode == 0, build.stderr[-3000:]
    assert build.stdout.strip() == str(target)  # stdout is the folder alone; progress went to stderr
    assert f"no shared data at {empty}" in build.stderr and "example/ data" in build.stderr
    card = json.loads((target / "search_r1_reranker.json").read_text())
    assert card["training_data"] == {"source": "example", "corpus_files": [str(REPO / "example/corpus.jsonl")],
                                     "qa_dir": str(REPO / "example/qa")}
    assert card["training"]["steps"] == 1 and card["data"]["train"]["questions"] > 0
    scores = CrossEncoderReranker(str(target), device="cpu").score(["capital of australia"] * 2, [
        '(Title: "Canberra") Canberra is the capital city of Australia.', '(Title: "Jupiter") A planet.'])
    assert scores.shape == (2,) and np.isfinite(scores).all()

    index, corpus = example_bm25
    env.update(INDEX=str(index), CORPUS=str(corpus), RETRIEVER="bm25", FAISS_GPU="0")
    env.pop("RERANKER", None)
    command = ["bash", str(REPO / "example/retriever/serve_reranked.sh")]
    with launch_server([], command=command, env=env, startup_timeout=300) as server:
        assert httpx.get(server.url + "/health").json()["reranker"]["model"] == str(target)
        hits = httpx.post(server.retrieve_url, json={"queries": ["capital of australia"], "return_scores": True},
                          timeout=60).json()["result"][0]
        assert len(hits) == 3
        log = server.log_tail(20000)
        assert "cached, trained on the repo's example/ data" in log
        assert f", reranker {target} on cpu (10 candidates per query)" in log  # the server's start-up line
