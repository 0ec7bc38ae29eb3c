"""The embedded default run, end to end: data, retriever, training (what ``train_*.sh`` call).

    python scripts/quickstart.py [--data-dir DIR] [--qa-dir example/qa] [--corpus example/corpus.jsonl]
                                 [--train-sources hotpotqa] [--test-sources SOURCES]
                                 [--retriever-url URL] [--no-retriever] [key=value ...]

0. checks the whole configuration first (the typed config and its start-up checks, the data files
   and model the overrides name, and whether the checkpoint it would resume fits this run:
   :mod:`verl.trainer.ppo.resume_check`), so a typo costs seconds, not a warm start;
1. the data: ``data.train_files`` / ``data.val_files`` when the overrides name them, else
   ``<data-dir>/{train,test}.parquet``. Without ``--data-dir`` that is the example folder
   ``data/example_search``, built from ``--qa-dir`` when missing or when it was built from other
   sources (``sources.json`` records them): by default HotpotQA train (the questions whose gold
   paragraphs ``example/corpus.jsonl`` holds; the example's NQ-style train questions have no passage
   there, so search cannot help on them) and the seven QA sources' test sets as in the paper
   (``scripts/data_process/qa_search_*_merge.py``). A ``--data-dir`` (``DATA_DIR``) is the user's:
   it is written only when a build is asked for (``--qa-dir``, ``--train-sources`` or
   ``--test-sources``), and a folder without the files is a one-line error;
2. the model: the overrides' ``actor_rollout_ref.model.path``, else SmolLM2-135M-Instruct, which with
   ``WARM_START=1`` first gets its SFT warm start (run once, cached: :func:`choose_model`);
3. if no retriever answers at ``--retriever-url`` and its host is this machine (a remote one is a
   one-line error): builds a BM25 index over ``--corpus`` once
   (cached under ``data/example_search``) and starts a retrieval server in the background, stopped at
   the end, its log in ``<trainer.default_local_dir>/logs/retrieval_server.log``;
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
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1")  # where a retriever may be started for the user
EXAMPLE_DATA_DIR = "data/example_search"  # the embedded default's data and index cache (ignored by git)
DATA_FILES = {"data.train_files": "train.parquet", "data.val_files": "test.parquet"}


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None,
                        help=f"folder holding train.parquet and test.parquet (default: {EXAMPLE_DATA_DIR}, "
                             "built from --qa-dir when missing)")
    parser.add_argument("--qa-dir", default=None,
                        help="FlashRAG-style QA jsonl folder to build the data from (default: example/qa)")
    parser.add_argument("--train-sources", default=None,
                        help="QA sources of train.parquet (used when the data is built). Default: hotpotqa, "
                             "the one example/corpus.jsonl answers; the paper's mix is nq,hotpotqa")
    parser.add_argument("--test-sources", default=None,
                        help="QA sources of test.parquet (default: the seven of the paper)")
    parser.add_argument("--corpus", default="example/corpus.jsonl")
    parser.add_argument("--index-dir", default=None, help=f"default: {EXAMPLE_DATA_DIR}/<corpus name>.bm25")
    parser.add_argument("--retriever-url", default=None,
                        help="default: retriever.url of the configuration (an override of it wins)")
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


def ensure_data(data_dir: Path, qa_dir: Path, train_sources: str | None = None,
                test_sources: str | None = None) -> None:
    """Write Search-R1 parquet files from the QA jsonl files unless they exist.

    Files this function built from other sources (its ``sources.json`` differs) are rebuilt; files
    without that record (made by the user, or by an older version) are kept, with a note.
    ``train_sources`` defaults to ``hotpotqa``, ``test_sources`` to the seven of the paper.
    """
    train_sources = train_sources or "hotpotqa"
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
        raise ValueError(f"no {data_dir}/train.parquet and no QA folder {qa_dir} to build it from")
    run([sys.executable, "scripts/data_process/qa_search_train_merge.py", "--local_dir", str(data_dir),
         "--data_sources", train_sources, "--input_dir", str(qa_dir)])
    sources = ["--data_sources", test_sources] if test_sources else []
    run([sys.executable, "scripts/data_process/qa_search_test_merge.py", "--local_dir", str(data_dir),
         "--input_dir", str(qa_dir), *sources])
    stamp.write_text(json.dumps(wanted) + "\n")


def data_defaults(args: argparse.Namespace, given: set[str]) -> list[str]:
    """``data.train_files`` / ``data.val_files`` overrides for the keys the user did not set.

    Without ``--data-dir`` they are the example folder's files, built when missing. A ``--data-dir``
    is the user's folder: built into only when asked (``--qa-dir``, ``--train-sources``,
    ``--test-sources``), else it must already hold the files.

    Raises:
        ValueError: the folder lacks a needed file (naming the folder and the files looked for), or
            a build has no QA folder to read.
    """
    needed = {key: name for key, name in DATA_FILES.items() if key not in given}
    if not needed:
        return []
    data_dir = REPO / (args.data_dir or EXAMPLE_DATA_DIR)
    if args.data_dir is None or args.qa_dir or args.train_sources or args.test_sources:
        ensure_data(data_dir, REPO / (args.qa_dir or "example/qa"), args.train_sources, args.test_sources)
    missing = [data_dir / name for name in needed.values() if not (data_dir / name).is_file()]
    if missing:
        raise ValueError(f"DATA_DIR={args.data_dir}: the folder {data_dir} has no {', '.join(p.name for p in missing)} "
                         f"(looked for {', '.join(map(str, missing))}); write them with scripts/data_process/ "
                         f"(README, Data), or name your files with data.train_files=... data.val_files=... "
                         f"(docs/quickstart.md); without a GPU and without DATA_DIR the run builds and uses the example data")
    return [f"{key}={data_dir / name}" for key, name in needed.items()]


def choose_model(overrides: list[str]) -> list[str]:
    """The model of the run: the overrides' ``actor_rollout_ref.model.path`` as given, else
    SmolLM2-135M-Instruct, which with ``WARM_START=1`` first gets the SFT warm start (run once,
    cached; the RL run starts from its checkpoint). Returns the overrides, extended with the path
    when the model is SmolLM2."""
    from verl.utils.model_zoo import smollm2_dir

    chosen = override_value(overrides, "actor_rollout_ref.model.path")
    if os.environ.get("WARM_START") != "1":
        return overrides if chosen else [*overrides, f"actor_rollout_ref.model.path={smollm2_dir()}"]
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


def check_run(overrides: list[str], user_model: bool):
    """The configuration the run will have, checked before anything slow: types and keys, the
    start-up checks, the data files, a model the user named, and the checkpoint it would resume
    (its step against an explicit ``trainer.total_training_steps``; the trainer compares a step
    count from epochs once it has read the data).

    Returns:
        The typed ``PPOConfig``.
    Raises:
        ValueError: naming the key, file or checkpoint (a ``ConfigError`` is one).
    """
    from verl.trainer.main_ppo import check_data_files, check_models, parse_config
    from verl.trainer.ppo.resume_check import check_resume, train_data_record

    config = parse_config(overrides)
    check_data_files(config)
    if user_model:
        check_models(config)
    if not config.trainer.val_only:
        check_resume(config, train_data_record(config.data.train_files), config.trainer.total_training_steps)
    return config


def retriever_answers(url: str, timeout: float = 3.0) -> bool:
    body = json.dumps({"queries": ["test"], "topk": 1, "return_scores": False}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


def build_index(corpus: Path, index_dir: Path) -> None:
    """A BM25 index of ``corpus`` in ``index_dir``, built unless its ``DONE`` marker names this corpus."""
    done = index_dir / "DONE"
    if done.exists() and done.read_text().strip() == str(corpus):
        return
    run([sys.executable, "-m", "search_r1.search.index_builder", "--retrieval_method", "bm25",
         "--corpus_path", str(corpus), "--save_dir", str(index_dir)])
    done.write_text(f"{corpus}\n")


def check_remote_retriever(args: argparse.Namespace) -> None:
    """A retriever URL on another machine must answer already: only a local one is started here.

    Raises:
        ValueError: naming the URL that does not answer.
    """
    remote = urlparse(args.retriever_url).hostname not in LOCAL_HOSTS
    if remote and not args.no_retriever and not retriever_answers(args.retriever_url):
        raise ValueError(f"no retriever answers at {args.retriever_url}; start it there (bash retrieval_launch.sh "
                         f"on that machine), or give a local URL to have a BM25 server started")


@contextmanager
def local_retriever(args: argparse.Namespace, log_path: Path | None = None):
    """Start a BM25 retrieval server when none answers at the URL; stop it on exit.

    Its output goes to ``log_path`` (kept; the train scripts put it beside the run's outputs) or,
    when None, to a temporary file removed after a clean stop.
    """
    if args.no_retriever or retriever_answers(args.retriever_url):
        yield
        return
    parsed = urlparse(args.retriever_url)
    from search_r1.search.launcher import launch_server

    corpus = (REPO / args.corpus).resolve()
    # Built indexes live in the example data folder (ours, ignored by git): never in the user's
    # DATA_DIR, nor beside the tracked corpus.
    index_dir = Path(args.index_dir) if args.index_dir else REPO / EXAMPLE_DATA_DIR / f"{corpus.stem}.bm25"
    build_index(corpus, index_dir)
    server_args = ["--retriever_name", "bm25", "--index_path", str(index_dir / "bm25"), "--corpus_path", str(corpus)]
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


def run_output_dir(config) -> Path:
    """The run's ``trainer.default_local_dir`` (relative to the checkout, where the trainer runs)."""
    return REPO / config.trainer.default_local_dir


def main(argv=None) -> int:
    from verl.trainer.main_ppo import parse_config

    args, overrides = parse_args(argv)
    os.chdir(REPO)  # relative paths mean what they mean to the trainer, which runs here
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    user_model = "actor_rollout_ref.model.path" in given
    try:
        checked = parse_config(overrides)  # a typo fails here, before any data, model or index is built
        # retriever.url=... wins over --retriever-url (RETRIEVER_URL), which wins over the config's default
        args.retriever_url = override_value(overrides, "retriever.url") or args.retriever_url or checked.retriever.url
        check_remote_retriever(args)
        defaults = [*data_defaults(args, given), f"retriever.url={args.retriever_url}"]
        defaults = [d for d in defaults if d.split("=", 1)[0] not in given]  # the user's value wins
        config = check_run([*defaults, *overrides], user_model)
    except ValueError as error:  # ConfigError is one; the message names the culprit
        print(f"error: {error}", file=sys.stderr)
        return 2
    overrides = choose_model(overrides)
    out = run_output_dir(config)
    with local_retriever(args, out / "logs" / "retrieval_server.log"):
        cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *defaults, *overrides]
        print("+ " + shlex.join(cmd), flush=True)
        return run_child(cmd, cwd=REPO)  # the trainer stops itself on SIGINT/SIGTERM, then the retriever stops


if __name__ == "__main__":
    sys.exit(run_or_exit(main))
