"""The retriever at wiki-18 scale (issue 21): start-up, memory, throughput and ANN recall, extrapolated.

    # one H200 (see benchmarks/device/retriever_scale.sh): 10M x 768, e5-base-shaped encoder
    python benchmarks/retriever_scale.py --data_dir /tmp/scale --num_vectors 10000000 \\
        --output $OUT/paper_scale_retriever.json
    # CPU smoke run (2 cores): 200k vectors, a 2-layer encoder, fewer requests
    flock /tmp/heavy.lock python benchmarks/retriever_scale.py --data_dir /tmp/scale_cpu \\
        --num_vectors 200000 --encoder_layers 2 --load_scale 0.03 --ann_vectors 100000 \\
        --output benchmarks/results/retriever_scale_cpu.json

Synthetic data (``scale_data``): clustered unit vectors in a FAISS Flat IP file, ~100-word passages
in JSONL, a randomly initialised BERT of e5-base's shape as the query encoder. Stages (``--stages``):

- ``gen``: write the data (skipped when ``data_dir`` already holds it for this size).
- ``start``: real server start-up (``/health`` ready), cold (files evicted from the page cache; the
  first start also converts the JSONL to Arrow) and after a restart with the Arrow copy present;
  the server's own ``load_s`` split, host RSS (anonymous vs file-backed), GPU memory per nvidia-smi.
- ``load``: per search backend (torch-sharded Flat; FAISS GPU Flat when a GPU build of FAISS
  imports), a warm start and then 1/64/256 concurrent single-query callers and 512-query requests
  through HTTP: QPS, p50/p99, the server's encode/search split, RSS after the load.
- ``ann``: on the first ``--ann_vectors`` rows, in-process (no HTTP): IVF-Flat, IVF-PQ and HNSW built
  by ``search_r1.search.ann`` (the index builder's code), FAISS GPU IVF and cuVS CAGRA when
  available, against exact Flat search: memory, build time, QPS at batch 1 and 512, recall@10.

A host-speed probe (``host_probe_ms``: a fixed pure-Python loop, ms) is recorded before each stage.
The report (JSON, rewritten after every stage so a timeout keeps finished stages) extrapolates to
wiki-18's 21,015,324 passages and states the issue's goals (start-up < 3 min cold and < 30 s warm,
host RSS < 1.5x the corpus text, >= 2,000 QPS at 256 callers) as pass/fail. All models are random
weights; all vectors and passages are synthetic, so recall figures describe clustered synthetic
vectors, not e5 embeddings.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import scale_data  # noqa: E402
from benchmarks.common import run_metadata  # noqa: E402
from benchmarks.gpu_generation import host_probe_ms  # noqa: E402

WIKI18_PASSAGES = 21_015_324
STAGES = ("gen", "start", "load", "ann")


def paths(data_dir: Path) -> dict[str, Path]:
    return {"vectors": data_dir / "synthetic_Flat.index", "corpus": data_dir / "corpus.jsonl",
            "arrow": data_dir / "corpus.jsonl.arrow", "encoder": data_dir / "e5_base_random",
            "marker": data_dir / "data.json"}


# ---------------------------------------------------------------- gen
def stage_gen(args, files: dict, tokenizer: str) -> dict:
    """Write vectors, passages, encoder and index meta unless the marker says they exist."""
    wanted = {"num_vectors": args.num_vectors, "dim": args.dim, "encoder_layers": args.encoder_layers}
    if files["marker"].exists():
        done = json.loads(files["marker"].read_text())
        if done.get("config") == wanted and files["vectors"].exists() and files["corpus"].exists():
            return {**done, "reused": True}
    need = args.num_vectors * (args.dim * 4 + 2 * 800) + (2 << 30)
    free = shutil.disk_usage(args.data_dir).free
    if need > free:
        per_row = args.dim * 4 + 2 * 800
        raise ValueError(f"{args.data_dir}: {free / 2**30:.1f} GiB free, {need / 2**30:.1f} GiB needed for "
                         f"{args.num_vectors} rows; at most ~{int((free - (2 << 30)) / per_row)} rows fit")
    for path in files.values():
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    words = scale_data.tokenizer_words(tokenizer)
    out = {"config": wanted, "tokenizer": tokenizer}
    out["vectors"] = scale_data.write_vectors(str(files["vectors"]), args.num_vectors, args.dim)
    out["passages"] = scale_data.write_passages(str(files["corpus"]), args.num_vectors, words)
    out["encoder"] = scale_data.save_random_encoder(str(files["encoder"]), tokenizer, args.encoder_layers)
    write_index_meta(files, args.num_vectors, args.dim)
    files["marker"].write_text(json.dumps(out, indent=2))
    return out


def write_index_meta(files: dict, num: int, dim: int) -> None:
    """The meta the index builder would write (so the server's corpus/encoder checks run)."""
    from search_r1.search.encoders import resolve_encoder_spec
    from search_r1.search.index_meta import IndexMeta

    spec = resolve_encoder_spec("e5", str(files["encoder"]))
    IndexMeta(retrieval_method="e5", faiss_type="Flat", dim=dim, encoder=spec.to_dict(),
              corpus={"path": str(files["corpus"]), "num_rows": num, "first_id": "0", "last_id": str(num - 1)},
              extra={"vectors": "synthetic (benchmarks/scale_data.py)"}).save(str(files["vectors"]))


# ---------------------------------------------------------------- servers
def server_args(files: dict, backend: str) -> list[str]:
    args = ["--index_path", str(files["vectors"]), "--corpus_path", str(files["corpus"]),
            "--retriever_name", "e5", "--retriever_model", str(files["encoder"]), "--topk", "3",
            "--max_queries", "512", "--max_batch_queries", "256"]
    return args + (["--faiss_gpu", "--gpu_search", backend] if backend != "cpu" else [])


def start_server(files: dict, backend: str, env: dict, evict: bool = False, drop_arrow: bool = False):
    """Start a server; returns ``(server, record)`` with ready time, load split, memory, residency."""
    from search_r1.search.launcher import launch_server

    if drop_arrow and files["arrow"].exists():
        files["arrow"].unlink()
    data_files = [files["vectors"], files["corpus"], files["arrow"], *files["encoder"].glob("*.safetensors")]
    if evict:
        scale_data.evict([str(p) for p in data_files])
    resident = {p.name: scale_data.resident_fraction(str(p)) for p in data_files if p.exists()}
    start = time.perf_counter()
    server = launch_server(server_args(files, backend), startup_timeout=1200, env=env)
    ready_s = time.perf_counter() - start
    import httpx

    health = httpx.get(server.url + "/health", timeout=30).json()
    record = {"backend": backend, "evicted": evict, "arrow_rebuilt": drop_arrow, "ready_s": round(ready_s, 2),
              "load_s": health.get("load_s"), "search_devices": health.get("search_devices"),
              "encoder_device": health.get("encoder_device"), "resident_before": resident,
              "host_memory_gib": _memory(server.process.pid, files),
              "gpu_memory_gib": scale_data.gpu_memory_of(server.process.pid)}
    print(f"  start {backend} (evicted={evict}, arrow rebuilt={drop_arrow}): ready in {ready_s:.1f} s, "
          f"load_s {record['load_s']}, host {record['host_memory_gib']}, gpu {record['gpu_memory_gib']} GiB",
          flush=True)
    return server, record


def _memory(pid: int, files: dict) -> dict:
    """Host memory of the server; ``data_mapped`` is the part that maps the corpus/index files."""
    mem = scale_data.process_memory(pid)
    mem["data_mapped"] = scale_data.mapped_rss(pid, [files["arrow"], files["vectors"], files["corpus"]])
    return mem


def stop(server) -> None:
    server.stop()
    try:
        os.unlink(server.log_path)
    except OSError:
        pass


def stage_start(args, files: dict, env: dict, backend: str) -> dict:
    out = {}
    for name, evict, drop in (("cold_first", True, True), ("cold_restart", True, False)):
        server, out[name] = start_server(files, backend, env, evict=evict, drop_arrow=drop)
        stop(server)
    return out


# ---------------------------------------------------------------- load
def load_plan(args) -> dict[str, tuple[int, int, int]]:
    """name -> (callers, queries per request, requests)."""
    plan = {"concurrent_1": (1, 1, 300), "concurrent_64": (64, 1, 64 * 40), "concurrent_256": (256, 1, 256 * 40),
            "batch_512": (1, 512, 20)}
    return {k: (c, q, max(c, 2, int(n * args.load_scale))) for k, (c, q, n) in plan.items()}


def stage_load(args, files: dict, env: dict, backends: list[str], queries: list[str]) -> dict:
    from benchmarks.retriever import run_load

    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    out = {}
    for backend in backends:
        try:
            server, start = start_server(files, backend, env)
        except RuntimeError as err:  # e.g. FAISS GPU present but failing: record and go on
            out[backend] = {"error": str(err)[-2000:]}
            continue
        results = {"warm_start": start}
        try:
            runner(run_load(server.url, queries, 8, 1, 32))  # warm-up (CUDA kernels, allocator)
            for name, (callers, per_request, requests) in load_plan(args).items():
                results[name] = runner(run_load(server.url, queries, callers, per_request, requests))
                r = results[name]
                print(f"  {backend} {name}: {r['qps']:.0f} q/s, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
                      f"batch {r['mean_batch_queries']:.1f}", flush=True)
            results["host_memory_after_gib"] = _memory(server.process.pid, files)
        except Exception as err:  # e.g. a FAISS GPU search failing: keep the other backend's figures
            results["error"] = f"{type(err).__name__}: {err}"[:2000] + "\n" + server.log_tail(2000)
        finally:
            stop(server)
        out[backend] = results
    return out


# ---------------------------------------------------------------- ann
def time_search(search, queries: np.ndarray, batch: int, min_calls: int = 3) -> dict:
    """QPS and per-call latency of ``search(batch_of_queries, 10)`` over ``queries``."""
    search(queries[:batch], 10)  # warm-up
    latencies, done = [], 0
    start = time.perf_counter()
    while done < len(queries) or len(latencies) < min_calls:
        lo = done % len(queries)
        part = queries[lo:lo + batch]
        t = time.perf_counter()
        search(part, 10)
        latencies.append(time.perf_counter() - t)
        done += len(part)
    wall = time.perf_counter() - start
    return {"qps": done / wall, "p50_ms": 1000 * float(np.median(latencies)), "calls": len(latencies)}


def _entry(name: str, search, queries, truth, memory_bytes: int, extra: dict) -> dict:
    from search_r1.search.ann import recall_at_k

    _, found = search(queries, 10)
    entry = {"name": name, "memory_gib": round(memory_bytes / 2**30, 3), **extra,
             "recall_at_10": recall_at_k(np.asarray(found), truth, 10),
             "batch_1": time_search(search, queries[:200], 1), "batch_512": time_search(search, queries, 512)}
    print(f"  {name} {extra.get('params', '')}: recall@10 {entry['recall_at_10']:.3f}, "
          f"{entry['batch_1']['qps']:.0f} q/s at batch 1, {entry['batch_512']['qps']:.0f} q/s at 512, "
          f"{entry['memory_gib']} GiB", flush=True)
    return entry


def stage_ann(args, files: dict, gpus: list[str], deadline: float) -> dict:
    from search_r1.search.ann import exact_topk, sample_rows
    from search_r1.search.faiss_gpu import faiss_has_cagra
    from search_r1.search.flat_file import open_flat_file

    flat = open_flat_file(files["vectors"])
    sub = dataclasses.replace(flat, ntotal=min(args.ann_vectors, flat.ntotal))  # a prefix of the rows
    rng = np.random.default_rng(5)
    queries = sample_rows(sub, 1024, seed=4)
    queries += 0.35 * rng.standard_normal(queries.shape).astype(np.float32) / np.sqrt(sub.dim)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    start = time.perf_counter()
    _, truth = exact_topk(sub, queries, 10, gpus[0] if gpus else "cpu")
    out = {"num_vectors": sub.ntotal, "num_queries": len(queries), "exact_truth_s": time.perf_counter() - start,
           "queries": "stored rows plus noise of the clusters' spread", "entries": [], "errors": {}}
    _flat_entries(sub, queries, truth, gpus, out)
    nlist = args.ann_nlist
    for faiss_type in (f"IVF{nlist},Flat", f"IVF{nlist},PQ{args.pq_bytes}", f"HNSW{args.hnsw_m}"):
        if time.monotonic() > deadline:
            out.setdefault("skipped", []).append(faiss_type)
            continue
        _approximate_entries(sub, faiss_type, queries, truth, gpus, out)
    if gpus and faiss_has_cagra() and time.monotonic() < deadline:
        _cagra_entry(sub, queries, truth, out)
    for entry in out["entries"]:
        entry["memory_gib_at_21m"] = round(entry["memory_gib"] * WIKI18_PASSAGES / sub.ntotal, 2)
    return out


def _error(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"[:2000]


def _flat_entries(sub, queries, truth, gpus: list[str], out: dict) -> None:
    """Exact search: torch shards (fp16 on GPUs, fp32 on the CPU) and FAISS's GPU Flat when present."""
    from search_r1.search.faiss_gpu import faiss_has_gpu, flat_file_to_gpus
    from search_r1.search.flat_shards import load_flat_shards

    shards = load_flat_shards(sub, gpus or ["cpu"])
    out["entries"].append(_entry("Flat (torch)", shards.search, queries, truth, shards.nbytes,
                                 {"device": shards.devices, "build_s": 0.0}))
    del shards
    if gpus and faiss_has_gpu():
        try:  # a broken GPU build must not cost the other entries
            gpu_flat = flat_file_to_gpus(sub, [0])
            out["entries"].append(_entry("Flat (FAISS GPU fp16)", gpu_flat.search, queries, truth,
                                         sub.ntotal * sub.dim * 2, {"device": "faiss:cuda:0", "build_s": 0.0}))
        except Exception as err:
            out["errors"]["Flat (FAISS GPU)"] = _error(err)


def _approximate_entries(sub, faiss_type: str, queries, truth, gpus: list[str], out: dict) -> None:
    """Build one index type with the index builder's code, sweep its search parameter on the CPU
    (and on the GPU for IVF with a FAISS GPU build)."""
    import faiss

    from search_r1.search.ann import build_from_flat
    from search_r1.search.faiss_gpu import faiss_has_gpu, index_to_gpus

    index, stats = build_from_flat(sub, faiss_type, log=lambda m: None)
    memory = int(faiss.serialize_index(index).nbytes)
    is_ivf = faiss_type.startswith("IVF")
    sweep = [("nprobe", v) for v in (16, 64)] if is_ivf else [("efSearch", v) for v in (64, 256)]
    for key, value in sweep:
        faiss.ParameterSpace().set_index_parameter(index, key, value)
        out["entries"].append(_entry(faiss_type, index.search, queries, truth, memory,
                                     {"device": "cpu", "params": {key: value}, **_rounded(stats)}))
    if gpus and faiss_has_gpu() and is_ivf:
        try:
            gpu_index = index_to_gpus(index, [0])
            for key, value in sweep:
                faiss.GpuParameterSpace().set_index_parameter(gpu_index, key, value)
                out["entries"].append(_entry(faiss_type + " (FAISS GPU)", gpu_index.search, queries, truth, memory,
                                             {"device": "faiss:cuda:0", "params": {key: value}, **_rounded(stats)}))
        except Exception as err:
            out["errors"][faiss_type + " (FAISS GPU)"] = _error(err)


def _cagra_entry(sub, queries, truth, out: dict) -> None:
    """cuVS CAGRA (graph degree 32) built on the GPU by the index builder's code."""
    from search_r1.search.ann import build_cagra
    from search_r1.search.faiss_gpu import index_to_gpus

    try:
        cpu_form, stats = build_cagra(sub, log=lambda m: None)
        gpu_index = index_to_gpus(cpu_form, [0])
        memory = sub.ntotal * (sub.dim * 4 + 32 * 4)  # float32 dataset + 32 neighbour ids per vector
        out["entries"].append(_entry("CAGRA (cuVS, degree 32)", gpu_index.search, queries, truth, memory,
                                     {"device": "faiss:cuda:0", **_rounded(stats)}))
    except Exception as err:
        out["errors"]["CAGRA"] = _error(err)


def _rounded(stats: dict) -> dict:
    return {("build_" + k if not k.startswith("build") else k): (round(v, 3) if isinstance(v, float) else v)
            for k, v in stats.items()}


# ---------------------------------------------------------------- extrapolation
def extrapolate(report: dict) -> dict:
    """Figures at 21,015,324 passages from those at ``num_vectors`` (linear in the data size).

    - start-up: the corpus and the vectors load in parallel, so the larger of the two grows with
      the data, everything else (Python, CUDA, encoder) is fixed:
      ``ready + (f - 1) * max(corpus, vectors)``
      (an over-estimate: each part's seconds include its fixed share, e.g. waiting for the GIL while
      the encoder's thread imports transformers);
    - host RSS: everything but the resident pages of the mapped corpus (torch, CUDA context,
      libraries, encoder, staging buffers) is fixed, those pages grow with the data:
      ``VmRSS - data_mapped + f * data_mapped`` (``data_mapped`` from ``/proc/<pid>/smaps``), plus,
      for the CPU backend, the float32 vectors held in host memory;
    - GPU memory: the fp16 vectors grow, the rest is fixed;
    - QPS at 256 callers: the server's search time per query grows with the rows, encode and HTTP do
      not; no overlap between them is assumed (conservative): ``1 / (1/qps + (f - 1) * search)``.
    """
    n = report["retriever"]["num_vectors"]
    dim = report["retriever"]["dim"]
    f = WIKI18_PASSAGES / n
    corpus_bytes = report.get("gen", {}).get("passages", {}).get("bytes")
    out = {"factor": round(f, 3),
           "corpus_text_gib_at_21m": round(corpus_bytes * f / 2**30, 2) if corpus_bytes else None}

    def start_at_21m(rec):
        parts = rec.get("load_s") or {}
        grow = max(parts.get("corpus", 0.0), parts.get("vectors", 0.0))
        return round(rec["ready_s"] + (f - 1) * grow, 1)

    def rss_at_21m(rec):
        mem = rec["host_memory_gib"]
        # Served on the CPU, the float32 vectors are host memory too, and grow with the rows.
        vectors = n * dim * 4 / 2**30 if rec.get("backend") == "cpu" else 0.0
        return round(mem.get("VmRSS", 0) + (f - 1) * (mem.get("data_mapped", 0) + vectors), 2)

    for name, rec in report.get("start", {}).items():
        out[f"start_{name}_s"] = start_at_21m(rec)
        out[f"host_rss_{name}_gib"] = rss_at_21m(rec)
    for backend, res in report.get("load", {}).items():
        if "warm_start" not in res:
            continue
        warm = res["warm_start"]
        out[f"start_warm_{backend}_s"] = start_at_21m(warm)
        out[f"host_rss_warm_{backend}_gib"] = rss_at_21m(warm)
        if "host_memory_after_gib" in res:
            after = {"host_memory_gib": res["host_memory_after_gib"], "backend": backend}
            out[f"host_rss_after_load_{backend}_gib"] = rss_at_21m(after)
        if warm.get("gpu_memory_gib") is not None:
            vectors_gib = n * dim * 2 / 2**30
            out[f"gpu_memory_{backend}_gib"] = round(warm["gpu_memory_gib"] + (f - 1) * vectors_gib, 2)
        if "concurrent_256" in res:
            r = res["concurrent_256"]
            search_s = r["server_ms_per_query"]["search"] / 1000
            out[f"qps_256_callers_{backend}"] = round(1 / (1 / r["qps"] + (f - 1) * search_s), 1)
    return out


def goals(extra: dict) -> dict:
    corpus = extra.get("corpus_text_gib_at_21m")
    cold = [v for k, v in extra.items() if k.startswith("start_cold")]
    warm = [v for k, v in extra.items() if k.startswith("start_warm")]
    rss = [v for k, v in extra.items() if k.startswith("host_rss")]
    qps = [v for k, v in extra.items() if k.startswith("qps_256")]
    return {"start_cold_under_180_s": bool(cold) and max(cold) < 180,
            "start_warm_under_30_s": bool(warm) and min(warm) < 30,
            "host_rss_under_1.5x_corpus": bool(rss and corpus) and max(rss) < 1.5 * corpus,
            "qps_256_callers_at_least_2000": bool(qps) and max(qps) >= 2000,
            "note": "extrapolated to 21,015,324 passages; warm: best backend; qps: best backend"}


# ---------------------------------------------------------------- main
def faiss_gpu_probe(site: str | None) -> dict:
    """Whether a FAISS GPU build imports from ``site`` (tried in a child so a broken one cannot kill us)."""
    if not site:
        return {"site": None, "ok": False, "reason": "no --faiss_gpu_site"}
    code = "import faiss; print(faiss.__version__, faiss.get_num_gpus(), hasattr(faiss, 'GpuIndexCagra'))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        return {"site": site, "ok": False, "reason": proc.stderr[-2000:]}
    version, gpus, cagra = proc.stdout.split()
    return {"site": site, "ok": int(gpus) > 0, "version": version, "gpus": int(gpus), "cagra": cagra == "True"}


def save(report: dict, outputs: list[Path]) -> None:
    report["meta"] = run_metadata()
    text = json.dumps(report, indent=2)
    for path in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", required=True, type=Path, help="synthetic data (~3.3 KB per vector at 768-d)")
    p.add_argument("--num_vectors", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--encoder_layers", type=int, default=12, help="e5-base has 12; fewer for CPU runs")
    p.add_argument("--tokenizer", default=None, help="an uncased BERT tokenizer folder (default: MiniLM's)")
    p.add_argument("--output", required=True, type=Path, help="report JSON (e.g. $OUT/paper_scale_retriever.json)")
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--backends", default=None, help="GPU: torch,faiss (faiss when it imports); CPU: cpu")
    p.add_argument("--load_scale", type=float, default=1.0, help="fraction of the default request counts")
    p.add_argument("--ann_vectors", type=int, default=250_000)
    p.add_argument("--ann_nlist", type=int, default=1024)
    p.add_argument("--pq_bytes", type=int, default=64)
    p.add_argument("--hnsw_m", type=int, default=32)
    p.add_argument("--faiss_gpu_site", default=None, help="folder holding a FAISS GPU build (e.g. /tmp/site-faiss)")
    p.add_argument("--time_budget_s", type=float, default=540, help="later ANN entries are skipped past it")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + args.time_budget_s
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    probe = faiss_gpu_probe(args.faiss_gpu_site)
    env = {"PYTHONPATH": os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)}
    if probe["ok"]:  # before this process imports faiss
        sys.path.insert(0, args.faiss_gpu_site)
        env["PYTHONPATH"] = os.pathsep.join([args.faiss_gpu_site, env["PYTHONPATH"]])
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    import torch

    gpus = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    backends = args.backends.split(",") if args.backends else (["torch"] + (["faiss"] if probe["ok"] else [])
                                                                if gpus else ["cpu"])
    tokenizer = args.tokenizer
    if tokenizer is None:
        from verl.utils.model_zoo import minilm_dir
        tokenizer = minilm_dir()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    files = paths(args.data_dir)
    partial = args.data_dir / "report.json"
    report = json.loads(partial.read_text()) if partial.exists() else {}
    if report.get("retriever", {}).get("num_vectors") != args.num_vectors:
        report = {}
    report.update({"benchmark": "retriever_scale", "faiss_gpu": probe, "backends": backends,
                   "retriever": {"num_vectors": args.num_vectors, "dim": args.dim, "metric": "inner product",
                                 "encoder": f"BERT e5-base shape, {args.encoder_layers} layers, random weights",
                                 "index": "Flat (synthetic clustered unit vectors)"}})
    import faiss
    import pyarrow

    report["versions"] = {"faiss": faiss.__version__, "faiss_gpu_build": hasattr(faiss, "StandardGpuResources"),
                          "pyarrow": pyarrow.__version__, "numpy": np.__version__}
    stages = args.stages.split(",")
    queries = scale_data.synthetic_queries(scale_data.tokenizer_words(tokenizer), 4096)
    for stage in STAGES:
        if stage not in stages:
            continue
        print(f"== {stage} ({time.monotonic() - started:.0f} s into the run)", flush=True)
        # the host's single-thread speed before each stage: the server's Python (HTTP, batching) follows it
        report.setdefault("host_probe_ms", {})[stage] = round(host_probe_ms(), 1)
        t = time.perf_counter()
        if stage == "gen":
            report["gen"] = stage_gen(args, files, tokenizer)
        elif stage == "start":
            report["start"] = stage_start(args, files, env, backends[0])
        elif stage == "load":
            report["load"] = stage_load(args, files, env, backends, queries)
        else:
            report["ann"] = stage_ann(args, files, gpus, deadline)
        report.setdefault("stage_seconds", {})[stage] = round(time.perf_counter() - t, 1)
        report["extrapolated_21m"] = extrapolate(report)
        report["goals"] = goals(report["extrapolated_21m"])
        save(report, [args.output, partial])
    print(json.dumps({"extrapolated_21m": report["extrapolated_21m"], "goals": report["goals"]}, indent=2))


if __name__ == "__main__":
    main()
