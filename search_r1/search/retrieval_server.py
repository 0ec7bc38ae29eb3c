"""The retrieval HTTP server: ``POST /retrieve``, ``GET /health``, ``GET /stats`` (FastAPI + uvicorn).

    python -m search_r1.search.retrieval_server --index_path indexes/minilm_Flat.index \
        --corpus_path example/corpus.jsonl --retriever_name minilm --topk 3
    python search_r1/search/retrieval_server.py ...      # Search-R1's form; also retriever_server.py

API (Search-R1's): ``{"queries": [str], "topk": int | null, "return_scores": bool}`` ->
``{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}``, one list per query;
``score`` is left out when ``return_scores`` is false (the reference crashed with a 500 there).
Concurrent requests are micro-batched (see ``batching.py``). Bad input gets a 4xx whose ``detail``
names the field; the server binds 127.0.0.1 unless ``--host`` says otherwise.

Backends: a dense FAISS index (``e5 | bge | minilm | <encoder path>``), ``bm25``, or a web search API
(``serper | google | serpapi | bing | brave``, see ``web_retriever``); ``--reranker_model`` puts a
cross-encoder behind any of them (``reranker``).
"""

from __future__ import annotations

if __package__ in (None, ""):
    # Started as a script (python search_r1/search/retrieval_server.py, Search-R1's form): the
    # repository root, not this folder, goes first on the path so the package imports resolve.
    import sys
    from pathlib import Path

    sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import logging
import os
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError

from search_r1.search.batching import MicroBatcher
from search_r1.search.web_backends import BACKENDS as WEB_BACKENDS

logger = logging.getLogger(__name__)


@dataclass
class ServerLimits:
    """Request limits; anything beyond them is a 4xx, never a 500.

    Attributes:
        default_topk: used when a request's ``topk`` is null.
        max_topk: largest ``topk`` accepted.
        max_queries: most queries in one request.
        max_body_bytes: largest request body (413 beyond).
        max_query_chars: longer queries are cut to this many characters before tokenising (the
            encoder then truncates to its ``max_length`` tokens); not an error.
        topk_reason: why ``max_topk`` is what it is, for the 422 (e.g. the reranker's candidates).
    """

    default_topk: int = 3
    max_topk: int = 100
    max_queries: int = 512
    max_body_bytes: int = 4 << 20
    max_query_chars: int = 8192
    topk_reason: str = "--max_topk"


class RetrieveRequest(BaseModel):
    """Body of ``POST /retrieve``; unknown fields are rejected (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid")
    queries: list[StrictStr]
    topk: StrictInt | None = None
    return_scores: StrictBool = False


def create_app(retriever, limits: ServerLimits, batcher: MicroBatcher | None = None,
               name: str = "") -> FastAPI:
    """The FastAPI app serving ``retriever`` (anything with ``search``, ``describe``, ``len``).

    Args:
        retriever: a ``DenseRetriever``, ``BM25Retriever``, ``WebRetriever`` or ``RerankedRetriever``.
        limits: request limits.
        batcher: the micro-batcher; default batches with a 2 ms wait bound.
        name: the retriever name reported on ``/health``.
    """
    batcher = batcher or MicroBatcher(retriever.search)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="search-r1 retriever", lifespan=lifespan)
    app.state.batcher, app.state.retriever = batcher, retriever

    @app.get("/health")
    async def health() -> dict:
        info = retriever.describe()
        encoder = info.get("encoder")
        return {"status": "ok", "ready": True, "retriever": name or info["kind"], "kind": info["kind"],
                "encoder": encoder["model_path"] if isinstance(encoder, dict) else encoder,
                "index_size": info["index_size"], "default_topk": limits.default_topk,
                "max_topk": limits.max_topk, "max_queries": limits.max_queries,
                "batching": batcher.batching,
                **{key: info[key] for key in ("encoder_device", "search_devices", "load_s", "mode", "url",
                                              "reranker") if key in info}}

    @app.get("/stats")
    async def stats() -> dict:
        out = batcher.stats.as_dict()
        if hasattr(retriever, "stats"):
            out["backend"] = retriever.stats()
        return out

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        body = await _read_body(request, limits.max_body_bytes)
        req = _parse_request(body, limits)
        topk = req.topk if req.topk is not None else limits.default_topk
        queries = [q[:limits.max_query_chars] for q in req.queries]
        try:
            results = await batcher.submit(queries, topk)
        except Exception as err:  # a failed search must not take the server down
            logger.exception("search failed")
            raise HTTPException(500, f"search failed: {type(err).__name__}: {err}") from None
        if not req.return_scores:
            results = [[{"document": hit["document"]} for hit in hits] for hits in results]
        return JSONResponse({"result": results})

    return app


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) bodies over ``limit`` bytes before reading them whole."""
    from starlette.requests import ClientDisconnect

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"request body: {declared} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(413, f"request body: exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise HTTPException(400, "request body: client disconnected") from None
    return b"".join(chunks)


def _parse_request(body: bytes, limits: ServerLimits) -> RetrieveRequest:
    """Validate the body; every failure is a 422 whose detail names the offending field."""
    try:
        req = RetrieveRequest.model_validate_json(body)
    except ValidationError as err:
        raise HTTPException(422, "; ".join(_describe_error(e) for e in err.errors())) from None
    if not req.queries:
        raise HTTPException(422, "queries: must contain at least one query")
    if len(req.queries) > limits.max_queries:
        raise HTTPException(422, f"queries: {len(req.queries)} queries exceed the limit of "
                                 f"{limits.max_queries} per request")
    if req.topk is not None and not 1 <= req.topk <= limits.max_topk:
        raise HTTPException(422, f"topk: must be between 1 and {limits.max_topk} ({limits.topk_reason}), "
                                 f"got {req.topk}")
    return req


def _describe_error(error: dict) -> str:
    location = ".".join(str(part) for part in error.get("loc", ())) or "body"
    return f"{location}: {error.get('msg', 'invalid')}"


def load_first_stage(args: argparse.Namespace):
    """The retriever named by ``--retriever_name``: a web backend, BM25 or a dense index."""
    if args.retriever_name in WEB_BACKENDS:
        from search_r1.search.web_retriever import web_retriever_from_args

        return web_retriever_from_args(args)
    from search_r1.search.loading import load_bm25_retriever, load_dense_retriever

    if args.retriever_name == "bm25":
        return load_bm25_retriever(args.index_path, args.corpus_path)
    return load_dense_retriever(args.index_path, args.corpus_path, args.retriever_name,
                               args.retriever_model, faiss_gpu=args.faiss_gpu,
                               pooling_method=args.pooling_method,
                               query_max_length=args.query_max_length, gpu_search=args.gpu_search)


def load_retriever(args: argparse.Namespace):
    """The first stage, behind the cross-encoder when ``--reranker_model`` is given.

    Raises:
        FileNotFoundError: a reranker model that cannot be had (checked before the first stage
            loads, so a long index load does not come first), or a missing index/corpus file.
        ValueError: a missing web API key, a corpus that does not match its index, ...
    """
    reranker_path = None
    if args.reranker_model:
        from search_r1.search.reranker import resolve_model_path

        reranker_path = resolve_model_path(args.reranker_model, flag="--reranker_model")
    retriever = load_first_stage(args)
    if reranker_path is None:
        return retriever
    from search_r1.search.reranker import CrossEncoderReranker, RerankedRetriever

    reranker = CrossEncoderReranker(reranker_path, device=args.reranker_device,
                                    batch_size=args.reranker_batch_size, max_length=args.reranker_max_length)
    return RerankedRetriever(retriever, reranker, retrieval_topk=args.retrieval_topk)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="search-r1 retrieval server")
    p.add_argument("--index_path", default=None, help="FAISS index file, or BM25 index directory")
    p.add_argument("--corpus_path", default=None, help="JSONL corpus the index was built from")
    p.add_argument("--topk", type=int, default=3, help="default topk when a request sends null")
    p.add_argument("--retriever_name", default="e5", help="e5 | bge | minilm | bm25 | a model path "
                   f"(dense), or a web backend: {' | '.join(WEB_BACKENDS)}")
    p.add_argument("--retriever_model", default=None, help="encoder path or hub id (default: the index's)")
    p.add_argument("--faiss_gpu", action="store_true", help="index sharded in fp16 on all GPUs, encoder fp16 on GPU")
    p.add_argument("--gpu_search", default="auto", choices=["auto", "faiss", "torch"],
                   help="with --faiss_gpu: torch's fp16 shards (Flat) or FAISS GPU indexes; auto: torch for Flat, "
                        "FAISS GPU for other types when FAISS is a GPU build")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--pooling_method", default=None, choices=["mean", "cls", "pooler"])
    p.add_argument("--query_max_length", type=int, default=None, help="query token limit")
    p.add_argument("--max_topk", type=int, default=100)
    p.add_argument("--max_queries", type=int, default=512)
    p.add_argument("--max_body_bytes", type=int, default=4 << 20)
    p.add_argument("--max_batch_queries", type=int, default=256, help="queries per micro-batch")
    p.add_argument("--max_wait_ms", type=float, default=2.0, help="micro-batch wait bound")
    p.add_argument("--no_batching", action="store_true", help="serve one request at a time (baseline)")
    p.add_argument("--log_level", default="warning")
    rerank = p.add_argument_group("reranker (Search-R1's retrieval_rerank_server flags)")
    rerank.add_argument("--reranker_model", default=None, help="cross-encoder folder or hub id "
                        "(AutoModelForSequenceClassification); off when not given")
    rerank.add_argument("--retrieval_topk", type=int, default=10, help="first-stage candidates per query")
    rerank.add_argument("--reranking_topk", type=int, default=None, help="results per query after "
                        "reranking when a request sends null (default: --topk)")
    rerank.add_argument("--reranker_batch_size", type=int, default=32, help="pairs per reranker forward")
    rerank.add_argument("--reranker_max_length", type=int, default=512, help="tokens per (query, passage) pair")
    rerank.add_argument("--reranker_device", default=None, help="default: cuda when available, else cpu")
    from search_r1.search.web_retriever import add_web_args

    add_web_args(p)
    args = p.parse_args(argv)
    if args.retriever_name not in WEB_BACKENDS and not (args.index_path and args.corpus_path):
        p.error(f"--index_path and --corpus_path are required unless --retriever_name is a web backend "
                f"({', '.join(WEB_BACKENDS)})")
    return args


def server_limits(args: argparse.Namespace) -> ServerLimits:
    """Request limits from the CLI; with a reranker, ``topk`` is at most its candidates.

    Raises:
        ValueError: a default ``topk`` outside ``1..max_topk``.
    """
    default_topk, max_topk, reason = args.topk, args.max_topk, "--max_topk"
    if args.reranker_model:
        if args.reranking_topk is not None:
            default_topk = args.reranking_topk
        if args.retrieval_topk < max_topk:
            max_topk, reason = args.retrieval_topk, "the reranker scores --retrieval_topk candidates"
    limits = ServerLimits(default_topk=default_topk, max_topk=max_topk, max_queries=args.max_queries,
                          max_body_bytes=args.max_body_bytes, topk_reason=reason)
    if not 1 <= limits.default_topk <= limits.max_topk:
        raise ValueError(f"default topk (--topk / --reranking_topk) must be between 1 and {max_topk} "
                         f"({reason}), got {limits.default_topk}")
    return limits


def build_app(args: argparse.Namespace) -> FastAPI:
    """Load the retriever and wrap it in the app, as configured by the CLI arguments."""
    limits = server_limits(args)
    retriever = load_retriever(args)
    batcher = MicroBatcher(retriever.search, max_batch_queries=args.max_batch_queries,
                           max_wait_s=args.max_wait_ms / 1000.0, batching=not args.no_batching)
    return create_app(retriever, limits, batcher, name=args.retriever_name)


def startup_line(args: argparse.Namespace, retriever) -> str:
    """The server's one start-up line: what it serves (index path and type, corpus and its size, or
    the web API), where, on which devices, and the reranker if any."""
    info = retriever.describe()
    if args.retriever_name in WEB_BACKENDS:
        what, device = f"{info['kind']} web search {info['url']} ({info['mode']})", "none (remote API)"
    else:
        kind = "bm25" if info["kind"] == "bm25" else f"dense {info['index_type']}"
        what = f"{kind} index {args.index_path}, corpus {args.corpus_path} ({info['index_size']} passages)"
        device = "cpu" if info["kind"] == "bm25" else \
            f"encoder {info['encoder_device']}, search {','.join(info['search_devices'])}"
    line = f"retrieval server: {what} on http://{args.host}:{args.port}, device {device}"
    if "reranker" in info:
        reranker = info["reranker"]
        line += (f", reranker {reranker['model']} on {reranker['device']} "
                 f"({reranker['retrieval_topk']} candidates per query)")
    return line


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args(argv)
    # Idle OpenMP workers (torch's and FAISS's runtimes) must sleep, not spin: on a few shared cores
    # spinning threads starve the event loop that parses the next batch's requests. Read when the
    # OpenMP libraries load, i.e. before the retriever imports torch/faiss.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    logging.basicConfig(level=args.log_level.upper())
    try:
        app = build_app(args)
    except (ValueError, FileNotFoundError) as err:
        # Start-up's user errors (a missing key, file or model, an index that does not match its
        # corpus) name their culprit; a traceback would only bury that line (--log_level debug shows it).
        logger.debug("start-up failed", exc_info=True)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(startup_line(args, app.state.retriever), flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)


if __name__ == "__main__":
    main()
