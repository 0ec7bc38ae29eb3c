"""Cross-encoder reranking: recall@3 of a gold passage, first stage alone vs + rerank, and its latency.

    flock /tmp/heavy.lock python benchmarks/rerank.py [--reranker DIR] [--quick]

Corpus: all shared passages (~30k; the MiniLM Flat and BM25 indexes of ``benchmarks/retriever.py``,
cached under ~/.cache/search_r1/bench_retriever). Reranker: ``--reranker`` (any
AutoModelForSequenceClassification folder or hub id), default the one ``scripts/build_reranker.py``
builds from the shipped MiniLM weights (built first when missing).

Quality, on held-out real questions (never trained on: checked against the reranker's recorded
training ids and question texts): HotpotQA dev questions with annotated supporting paragraphs (gold =
those paragraphs) and NQ test questions whose e5-retrieved wiki-18 passages hold the answer (gold =
those passages). For BM25 and MiniLM dense first stages: recall@3 (a gold passage in the top 3), for
HotpotQA also both-gold@3 (both supporting paragraphs, which a 2-hop question needs), and MRR@10 -
first stage alone (its top 3) vs the first stage's top ``--retrieval_topk`` reranked to 3.

Latency: real servers on 127.0.0.1 with and without ``--reranker_model`` (same first stage), 1 and 64
closed-loop callers sending one query per request; the added latency per query is the difference of
the mean and p50 request latencies, and the reranker's share of server time comes from ``/stats``.
Writes benchmarks/results/rerank.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
for _p in (str(REPO), str(REPO / "benchmarks"), str(REPO / "scripts")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from common import save_report  # noqa: E402
from retriever import closed_loop_requests, prepare_indexes, request_bytes  # noqa: E402

from search_r1.search.launcher import launch_server  # noqa: E402

SHARED = Path(os.environ.get("SEARCH_R1_SHARED_DATA", REPO.parent / "shared" / "data"))


def _jsonl(path: Path) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def held_out_questions(corpus: dict[str, str], train_ids: set[str], train_texts: set[str]) -> dict[str, list[dict]]:
    """HotpotQA dev (gold paragraphs) and NQ test (answer-bearing linked passages) questions."""
    from build_reranker import holds_answer, normalize

    hotpot = [{"id": r["id"], "question": r["question"], "gold": set(r["gold_passage_ids"]),
               "answers": r["golden_answers"]}
              for r in _jsonl(SHARED / "qa/hotpotqa/dev.jsonl") if r.get("gold_passage_ids")]
    nq = []
    for r in _jsonl(SHARED / "qa/nq/test.jsonl"):
        gold = {p for p in r.get("sr1_retrieved_passage_ids") or [] if holds_answer(r["golden_answers"], corpus[p])}
        if gold:
            nq.append({"id": r["id"], "question": r["question"], "gold": gold, "answers": r["golden_answers"]})
    for rows in (hotpot, nq):
        leaked = [r["id"] for r in rows if r["id"] in train_ids or normalize(r["question"]) in train_texts]
        if leaked:
            raise ValueError(f"benchmark questions seen in reranker training: {leaked[:5]}")
    return {"hotpotqa_dev": hotpot, "nq_test": nq}


def quality(first_stage, reranker, questions: list[dict], k: int, cache: dict) -> dict:
    """recall@3, both-gold@3 (two gold passages in the top 3; questions with one gold: that one) and
    MRR@``k`` of the first stage's order vs its top ``k`` reranked. ``cache`` keeps pair scores
    ``(question, passage id) -> score`` across first stages (their candidates overlap)."""
    from search_r1.search.reranker import pair_text

    hits = first_stage.search([q["question"] for q in questions], k)
    todo = list(dict.fromkeys((q["question"], x["document"]["id"], x["document"]["contents"])
                              for q, h in zip(questions, hits) for x in h
                              if (q["question"], x["document"]["id"]) not in cache))
    if todo:
        scores = reranker.score([t[0] for t in todo], [pair_text(t[2]) for t in todo])
        cache.update({(t[0], t[1]): float(v) for t, v in zip(todo, scores)})
    stats = {"first_stage": [], "reranked": []}
    for q, h in zip(questions, hits):
        ids = [x["document"]["id"] for x in h]
        part = np.array([cache[(q["question"], pid)] for pid in ids])
        reranked = [ids[i] for i in np.argsort(-part, kind="stable")]
        for name, order in (("first_stage", ids), ("reranked", reranked)):
            first = next((rank for rank, pid in enumerate(order, 1) if pid in q["gold"]), None)
            stats[name].append((any(p in q["gold"] for p in order[:3]),
                                min(2, len(q["gold"])) <= sum(p in q["gold"] for p in order[:3]),
                                1.0 / first if first else 0.0))
    out = {"questions": len(questions), "candidates": k, "pairs_scored": len(todo)}
    for name, rows in stats.items():
        arr = np.array(rows, dtype=float)
        out[name] = {"recall@3": arr[:, 0].mean(), "both_gold@3": arr[:, 1].mean(), f"mrr@{k}": arr[:, 2].mean()}
    out["recall@3_gain"] = out["reranked"]["recall@3"] - out["first_stage"]["recall@3"]
    out["recall@3_ratio"] = out["reranked"]["recall@3"] / max(out["first_stage"]["recall@3"], 1e-9)
    return out


async def closed_loop(url: str, queries: list[str], concurrency: int, num_requests: int) -> dict:
    """``concurrency`` raw keep-alive HTTP/1.1 callers, one query per request, ``num_requests`` in all."""
    parsed = httpx.URL(url)
    bodies = [request_bytes(parsed.host, [queries[i % len(queries)]]) for i in range(num_requests)]
    latencies, wall, before, after = await closed_loop_requests(url, bodies, concurrency, timeout=600)
    delta = {k: after[k] - before[k] for k in ("queries", "batches", "encode_s", "search_s", "rerank_s")}
    return {"callers": concurrency, "requests": len(latencies), "wall_s": wall, "qps": len(latencies) / wall,
            "mean_ms": 1000 * statistics.fmean(latencies), "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * sorted(latencies)[min(len(latencies) - 1, int(0.99 * (len(latencies) - 1)))],
            "mean_batch_queries": delta["queries"] / max(1, delta["batches"]),
            "server_ms_per_query": {k[:-2]: 1000 * delta[k] / max(1, delta["queries"])
                                    for k in ("encode_s", "search_s", "rerank_s")}}


def latency(server_args: list[str], reranker: str, queries: list[str], k: int, plan: dict) -> dict:
    out = {}
    for mode, extra in (("first_stage", []), ("reranked", ["--reranker_model", reranker, "--retrieval_topk", str(k),
                                                           "--reranking_topk", "3"])):
        with launch_server(server_args + extra, startup_timeout=600) as server:
            asyncio.run(closed_loop(server.url, queries, 2, 4))  # warm-up
            for name, (callers, requests) in plan.items():
                result = asyncio.run(closed_loop(server.url, queries, callers, requests))
                out[f"{mode}_{name}"] = result
                print(f"  {mode} {name}: mean {result['mean_ms']:.0f} ms, p50 {result['p50_ms']:.0f} ms, "
                      f"{result['qps']:.1f} q/s, batch {result['mean_batch_queries']:.1f}", flush=True)
    for name in plan:
        base, rer = out[f"first_stage_{name}"], out[f"reranked_{name}"]
        out[f"added_{name}"] = {"mean_ms": rer["mean_ms"] - base["mean_ms"], "p50_ms": rer["p50_ms"] - base["p50_ms"],
                                "latency_ratio_mean": rer["mean_ms"] / base["mean_ms"],
                                "qps_ratio": rer["qps"] / base["qps"]}
    return out


def quality_section(paths: dict, reranker_path: str, questions: dict[str, list[dict]], k: int) -> dict:
    from search_r1.search.loading import load_bm25_retriever, load_dense_retriever
    from search_r1.search.reranker import CrossEncoderReranker

    reranker = CrossEncoderReranker(reranker_path, batch_size=32, max_length=256)
    cache: dict = {}
    stages = {"bm25": load_bm25_retriever(str(paths["bm25"]), str(paths["corpus"])),
              "dense_minilm": load_dense_retriever(str(paths["dense"]), str(paths["corpus"]), "minilm")}
    out = {}
    for stage, retriever in stages.items():
        for dataset, rows in questions.items():
            started = time.perf_counter()
            res = out[f"{stage}/{dataset}"] = quality(retriever, reranker, rows, k, cache)
            res["seconds"] = round(time.perf_counter() - started, 1)
            print(f"{stage} {dataset}: recall@3 {res['first_stage']['recall@3']:.3f} -> "
                  f"{res['reranked']['recall@3']:.3f} ({res['seconds']:.0f} s, {res['pairs_scored']} pairs)", flush=True)
        parts = [out[f"{stage}/{d}"] for d in questions]
        n = sum(r["questions"] for r in parts)
        pooled = {m: {"recall@3": sum(r[m]["recall@3"] * r["questions"] for r in parts) / n}
                  for m in ("first_stage", "reranked")}
        out[f"{stage}/all"] = {"questions": n, **pooled,
                               "recall@3_gain": pooled["reranked"]["recall@3"] - pooled["first_stage"]["recall@3"]}
    return out


def latency_section(paths: dict, reranker_path: str, questions: dict[str, list[dict]], k: int, quick: bool) -> dict:
    plan = {"callers_1": (1, 10 if quick else 30), "callers_64": (64, 64 if quick else 192)}
    queries = [q["question"] for rows in questions.values() for q in rows]
    queries = [queries[i] for i in np.random.default_rng(0).permutation(len(queries))]
    common = ["--corpus_path", str(paths["corpus"]), "--topk", "3", "--max_queries", "512"]
    servers = {"bm25": ["--index_path", str(paths["bm25"]), "--retriever_name", "bm25", *common],
               "dense_minilm": ["--index_path", str(paths["dense"]), "--retriever_name", "minilm", *common]}
    out = {}
    for stage, server_args in servers.items():
        print(f"latency: {stage}", flush=True)
        out[stage] = latency(server_args, reranker_path, queries, k, plan)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache_dir", default=str(Path.home() / ".cache" / "search_r1" / "bench_retriever"))
    parser.add_argument("--reranker", default=None, help="default: scripts/build_reranker.py's (built if missing)")
    parser.add_argument("--retrieval_topk", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="fewer latency requests")
    parser.add_argument("--skip_latency", action="store_true")
    parser.add_argument("--max_questions", type=int, default=None, help="per dataset (smoke runs)")
    parser.add_argument("--out_dir", default=None, help="default benchmarks/results")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from build_reranker import ensure_reranker, normalize

    reranker_path = args.reranker or ensure_reranker()
    card = Path(reranker_path) / "search_r1_reranker.json"
    card_data = json.loads(card.read_text()) if card.exists() else {}
    train_ids = set(card_data.get("train_question_ids", []))
    paths = prepare_indexes(Path(args.cache_dir), None, argparse.Namespace(gpu=False, encoder=None, corpus=None))
    corpus = {r["id"]: r["contents"] for r in _jsonl(paths["corpus"])}
    train_texts = {normalize(r["question"]) for name in ("hotpotqa/train", "musique/train", "ambigqa/train")
                   for r in _jsonl(SHARED / "qa" / f"{name}.jsonl") if r["id"] in train_ids}
    questions = held_out_questions(corpus, train_ids, train_texts)
    questions = {name: rows[:args.max_questions] for name, rows in questions.items()}
    results = {"quality": quality_section(paths, reranker_path, questions, args.retrieval_topk), "latency": {}}
    if not args.skip_latency:
        results["latency"] = latency_section(paths, reranker_path, questions, args.retrieval_topk, args.quick)
    report = {"benchmark": "rerank", "reranker": reranker_path, "reranker_card": {
        k: card_data.get(k) for k in ("name", "base", "recipe", "training", "validation", "data")},
        "corpus_passages": len(corpus), "loadavg": os.getloadavg(), **results}
    save_report("rerank", report, args.out_dir)


if __name__ == "__main__":
    main()
