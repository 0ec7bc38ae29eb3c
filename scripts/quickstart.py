"""The embedded default run, end to end: data, retriever, training (what ``train_*.sh`` call).

    python scripts/quickstart.py [--data-dir DIR] [--qa-dir example/qa] [--corpus example/corpus.jsonl]
                                 [--train-sources hotpotqa] [--test-sources SOURCES]
                                 [--retriever-url URL] [--no-retriever] [key=value ...]

1. prepares ``<data-dir>/{train,test}.parquet`` from ``--qa-dir`` when they are missing, or when
   they were built here from other sources (``sources.json`` records them): by default HotpotQA train
   (the questions whose gold paragraphs ``example/corpus.jsonl`` holds; the example's NQ-style train
   questions have no passage there, so search cannot help on them) and the seven QA sources' test
   sets as in the paper (``scripts/data_process/qa_search_*_merge.py``);
2. optional warm start (``WARM_START=1``): the SFT step of issue 8 runs once and its checkpoint
   becomes the initial policy (hook: :func:`maybe_warm_start`);
3. if no retriever answers at ``--retriever-url``: builds a BM25 index over ``--corpus`` once
   (cached under ``--data-dir``) and starts a retrieval server in the background, stopped at the end,
   its log in ``<trainer.default_local_dir>/logs/retrieval_server.log`` (a temporary file, removed
   after a clean stop, when the overrides do not name that folder);
4. runs ``python -m verl.trainer.main_ppo`` with the remaining ``key=value`` overrides.

SIGINT/SIGTERM (Ctrl-C, ``kill``) are passed on to the step running (data scripts, warm start,
trainer), which stops itself with one line; then the retriever is stopped and this script exits
with the step's status (130, 143).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from verl.trainer.run_exit import run_or_exit
from verl.utils.signals import run_child, stopped_by_signal

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="data/example_search")
    parser.add_argument("--qa-dir", default="example/qa", help="FlashRAG-style QA jsonl folder")
    parser.add_argument("--train-sources", default="hotpotqa",
                        help="QA sources of train.parquet (used when the data is built). Default: the ones "
                             "example/corpus.jsonl answers; the paper's mix is nq,hotpotqa")
    parser.add_argument("--test-sources", default=None,
                        help="QA sources of test.parquet (default: the seven of the paper)")
    parser.add_argument("--corpus", default="example/corpus.jsonl")
    parser.add_argument("--index-dir", default=None, help="default: <data-dir>/<corpus name>.bm25")
    parser.add_argument("--retriever-url", default="http://127.0.0.1:8000/retrieve")
    parser.add_argument("--no-retriever", action="store_true", help="never start a retrieval server")
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("--")]
    if unknown:
        parser.error(f"unknown option(s) {unknown}; Hydra overrides are written key=value")
    return args, overrides


def run(cmd: list[str], **kwargs) -> None:
    """Run a step to its end; a step stopped by SIGINT/SIGTERM (it said so) ends this script with its status."""
    print("+ " + shlex.join(cmd), flush=True)
    returncode = run_child(cmd, cwd=REPO, **kwargs)
    if stopped_by_signal(returncode):
        raise SystemExit(returncode if returncode > 0 else 128 - returncode)
    if returncode:
        raise subprocess.CalledProcessError(returncode, cmd)


def ensure_data(data_dir: Path, qa_dir: Path, train_sources: str = "hotpotqa",
                test_sources: str | None = None) -> None:
    """Write Search-R1 parquet files from the QA jsonl files unless they exist.

    Files this function built from other sources (its ``sources.json`` differs) are rebuilt; files
    without that record (made by the user, or by an older version) are kept, with a note.
    """
    stamp = data_dir / "sources.json"
    wanted = {"train": train_sources, "test": test_sources, "qa_dir": str(qa_dir)}
    if (data_dir / "train.parquet").exists() and (data_dir / "test.parquet").exists():
        if not stamp.exists():
            print(f"note: using the existing {data_dir}/{{train,test}}.parquet as they are (delete them to "
                  f"rebuild from {qa_dir} with --train-sources {train_sources})", flush=True)
            return
        if json.loads(stamp.read_text()) == wanted:
            return
    if not qa_dir.is_dir():
        raise SystemExit(f"error: no {data_dir}/train.parquet and no QA folder {qa_dir} to build it from")
    run([sys.executable, "scripts/data_process/qa_search_train_merge.py", "--local_dir", str(data_dir),
         "--data_sources", train_sources, "--input_dir", str(qa_dir)])
    sources = ["--data_sources", test_sources] if test_sources else []
    run([sys.executable, "scripts/data_process/qa_search_test_merge.py", "--local_dir", str(data_dir),
         "--input_dir", str(qa_dir), *sources])
    stamp.write_text(json.dumps(wanted) + "\n")


def maybe_warm_start(overrides: list[str]) -> list[str]:
    """The SFT warm start of the embedded default: with ``WARM_START=1`` and SmolLM2 as the model
    (or none named), run the SFT step once (cached) and start RL from its checkpoint. Returns the
    overrides, extended with the model path; unchanged for any other model."""
    if os.environ.get("WARM_START") != "1":
        return overrides
    from verl.utils.model_zoo import smollm2_dir

    chosen = override_value(overrides, "actor_rollout_ref.model.path")
    if chosen and Path(chosen).expanduser().resolve() != Path(smollm2_dir()).resolve():
        # The warm start is SmolLM2's; a model the user chose (BASE_MODEL, model.path=) is trained as given.
        print(f"warm start: skipped, the run trains {chosen}", flush=True)
        return overrides
    script = REPO / "scripts" / "warm_start.py"
    if not script.exists():
        raise SystemExit("error: WARM_START=1 but scripts/warm_start.py (the SFT step) is not available")
    out = REPO / "checkpoints" / "warm_start"
    if not (out / "huggingface" / "config.json").exists():
        run([sys.executable, str(script), "--output", str(out)])
    return [*overrides, f"actor_rollout_ref.model.path={out / 'huggingface'}"]


def retriever_answers(url: str, timeout: float = 3.0) -> bool:
    body = json.dumps({"queries": ["test"], "topk": 1, "return_scores": False}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


def build_index(corpus: Path, index_dir: Path) -> None:
    if (index_dir / "DONE").exists():
        return
    run([sys.executable, "-m", "search_r1.search.index_builder", "--retrieval_method", "bm25",
         "--corpus_path", str(corpus), "--save_dir", str(index_dir)])
    (index_dir / "DONE").write_text("ok\n")


@contextmanager
def local_retriever(args: argparse.Namespace, log_path: Path | None = None):
    """Start a BM25 retrieval server when none answers at the URL; stop it on exit.

    Its output goes to ``log_path`` (kept; the train scripts put it beside the run's outputs) or,
    when None, to a temporary file removed after a clean stop.
    """
    if args.no_retriever or retriever_answers(args.retriever_url):
        yield
        return
    from search_r1.search.launcher import launch_server

    corpus = (REPO / args.corpus).resolve()
    # Built indexes live with the prepared data (ignored by git), not beside the tracked corpus.
    index_dir = Path(args.index_dir) if args.index_dir else REPO / args.data_dir / f"{corpus.stem}.bm25"
    build_index(corpus, index_dir)
    parsed = urlparse(args.retriever_url)
    server_args = ["--retriever_name", "bm25", "--index_path", str(index_dir / "bm25"), "--corpus_path", str(corpus),
                   "--topk", "3"]
    where = f" (log: {log_path})" if log_path else ""
    print(f"+ retrieval server on {args.retriever_url} over {corpus}{where}", flush=True)
    try:
        # the server imports search_r1 from this checkout wherever the quickstart was started from
        env = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
        server = launch_server(server_args, host=parsed.hostname or "127.0.0.1", port=parsed.port or 8000,
                               log_path=log_path, env=env)
    except RuntimeError as err:
        raise SystemExit(f"error: {err}") from None
    with server:
        yield


def override_value(overrides: list[str], key: str) -> str | None:
    """The value the last override of ``key`` (plain, ``+`` or ``++`` form) sets, or None."""
    for override in reversed(overrides):
        name, _, value = override.partition("=")
        if name.lstrip("+~") == key and value:
            return value
    return None


def run_output_dir(overrides: list[str]) -> Path | None:
    """``trainer.default_local_dir`` when the overrides set it (the train scripts do), else None."""
    value = override_value(overrides, "trainer.default_local_dir")
    return REPO / value if value else None


def main(argv=None) -> int:
    args, overrides = parse_args(argv)
    args.retriever_url = override_value(overrides, "retriever.url") or args.retriever_url  # the last one wins
    data_dir = REPO / args.data_dir
    ensure_data(data_dir, REPO / args.qa_dir, args.train_sources, args.test_sources)
    overrides = maybe_warm_start(overrides)
    defaults = [f"data.train_files={data_dir / 'train.parquet'}", f"data.val_files={data_dir / 'test.parquet'}",
                f"retriever.url={args.retriever_url}"]
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    defaults = [d for d in defaults if d.split("=", 1)[0] not in given]  # the user's value wins
    out = run_output_dir(overrides)
    with local_retriever(args, out / "logs" / "retrieval_server.log" if out else None):
        cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *defaults, *overrides]
        print("+ " + shlex.join(cmd), flush=True)
        return run_child(cmd, cwd=REPO)  # the trainer stops itself on SIGINT/SIGTERM, then the retriever stops


if __name__ == "__main__":
    sys.exit(run_or_exit(main))
