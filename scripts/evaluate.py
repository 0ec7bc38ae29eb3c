"""What ``evaluate.sh`` runs: evaluation data, an optional local retriever, then ``main_eval``.

    python scripts/evaluate.py [--data-dir DIR] [--qa-dir example/qa] [--corpus example/corpus.jsonl]
                               [--retriever-url URL] [--start-retriever] [--max_per_source N]
                               [--output_dir DIR] [--html] [--latest-of RUN_DIR] [key=value ...]
    python scripts/evaluate.py --compare A.json B.json

0. checks the configuration first (the typed config and its start-up checks), before anything slow;
1. with ``--qa-dir``, writes ``<data-dir>/test.parquet`` from the QA jsonl files when it is missing
   (the seven sources' test sets, ``scripts/data_process/qa_search_test_merge.py``);
2. the model: ``actor_rollout_ref.model.path`` when the overrides set it, else the latest
   ``global_step_N/huggingface`` export under ``--latest-of`` (the quick start's run), else the
   SmolLM2 warm start (``scripts/warm_start.py``, built once and cached); it says which;
3. with ``--start-retriever``, starts a BM25 server over ``--corpus`` at ``--retriever-url`` when
   none answers there, and stops it at the end (the training scripts' code); otherwise the
   retriever must already answer (``main_eval`` says so in one line);
4. runs ``python -m verl.trainer.main_eval`` with ``data.val_files``, ``retriever.url``, the options
   above as ``evaluation.*`` keys, and the remaining ``key=value`` overrides (which win).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import quickstart  # noqa: E402  (the training scripts' retriever start-up)

from verl.trainer.run_exit import run_or_exit  # noqa: E402
from verl.utils.signals import run_child  # noqa: E402


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                        help="compare two evaluation.json files and exit")
    parser.add_argument("--data-dir", default="data/example_search", help="folder holding test.parquet")
    parser.add_argument("--qa-dir", default=None, help="build test.parquet from this QA jsonl folder when missing")
    parser.add_argument("--corpus", default="example/corpus.jsonl", help="corpus of a started retriever")
    parser.add_argument("--index-dir", default=None, help="default: see quickstart.py's --index-dir")
    parser.add_argument("--retriever-url", default=None,
                        help="default: retriever.url of the configuration (an override of it wins)")
    parser.add_argument("--start-retriever", action="store_true",
                        help="start a local BM25 server over --corpus when none answers at --retriever-url")
    parser.add_argument("--max_per_source", "--max-per-source", type=int, default=None,
                        help="evaluate the first N questions of each data source")
    parser.add_argument("--output_dir", "--output-dir", default=None, help="default: see evaluation.output_dir")
    parser.add_argument("--latest-of", default=None, metavar="RUN_DIR",
                        help="without a model override: evaluate this run's latest checkpoint export, else the "
                             "SmolLM2 warm start")
    parser.add_argument("--html", action="store_true",
                        help="also write report.html: every question's trajectory (evaluation.html=true)")
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("--")]
    if unknown:
        parser.error(f"unknown option(s) {unknown}; Hydra overrides are written key=value")
    return args, overrides


def ensure_test_data(data_dir: Path, qa_dir: str | None) -> Path:
    """``<data_dir>/test.parquet``, built from ``qa_dir`` when missing and a QA folder is given."""
    path = data_dir / "test.parquet"
    if not path.exists() and qa_dir:
        quickstart.run([sys.executable, "scripts/data_process/qa_search_test_merge.py", "--local_dir", str(data_dir),
                        "--input_dir", str(REPO / qa_dir)])
    return path


def precheck(overrides: list[str]) -> None:
    """The model and data checks of ``main_eval`` (the last value of each key wins, as in Hydra).

    Raises:
        ValueError: as :func:`verl.trainer.evaluation.inputs.resolve_model` / ``check_parquet``.
    """
    from verl.trainer.evaluation import inputs

    values = dict(o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)
    if "actor_rollout_ref.model.path" in values:
        inputs.resolve_model(values["actor_rollout_ref.model.path"])
    if "data.val_files" in values and not values["data.val_files"].startswith("["):
        inputs.check_parquet(values["data.val_files"], values.get("data.prompt_key", "prompt"))


def default_model(run_dir: str | None) -> tuple[str, str]:
    """``(model path, what it is)`` when no model is named: the latest complete checkpoint's
    ``huggingface/`` export under ``run_dir`` (the quick start's run), else the SmolLM2 warm start
    (built once and cached: minutes the first time)."""
    from verl.trainer.ppo import checkpointing

    latest = checkpointing.find_latest(REPO / run_dir) if run_dir else None
    if latest is not None and (latest / "huggingface" / "config.json").is_file():
        return str(latest / "huggingface"), f"the latest checkpoint of {run_dir}"
    from warm_start import ensure_warm_start

    where = f"no checkpoint under {run_dir} yet" if run_dir else "no model named"
    return ensure_warm_start(), f"the SmolLM2 warm start; {where}"


def main(argv=None) -> int:
    args, overrides = parse_args(argv)
    if args.compare:
        from verl.trainer.evaluation.compare import main as compare

        return compare(list(args.compare))
    data_dir = (REPO / args.data_dir).resolve()
    defaults = [f"data.val_files={data_dir / 'test.parquet'}"]
    if args.retriever_url:
        defaults.append(f"retriever.url={args.retriever_url}")
    if args.max_per_source is not None:
        defaults.append(f"evaluation.max_per_source={args.max_per_source}")
    if args.output_dir:
        defaults.append(f"evaluation.output_dir={Path(args.output_dir).resolve()}")
    if args.html:
        defaults.append("evaluation.html=true")
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    defaults = [d for d in defaults if d.split("=", 1)[0] not in given]  # the user's value wins
    try:
        from verl.trainer.main_ppo import parse_config

        checked = parse_config(defaults + overrides)  # a typo fails here, before a warm start or a server
        args.retriever_url = checked.retriever.url
        if "data.val_files" not in given:
            ensure_test_data(data_dir, args.qa_dir)
        if "actor_rollout_ref.model.path" not in given:
            model, what = default_model(args.latest_of)
            print(f"evaluating {model} ({what}; BASE_MODEL=... names another)", flush=True)
            defaults.append(f"actor_rollout_ref.model.path={model}")
        if args.start_retriever:  # fail on a bad model or data file before starting a server
            precheck(defaults + overrides)
    except ValueError as error:  # ConfigError is one; the message names the culprit
        print(f"error: {error}", file=sys.stderr)
        return 2
    retriever = argparse.Namespace(no_retriever=not args.start_retriever, retriever_url=args.retriever_url,
                                   corpus=args.corpus, index_dir=args.index_dir)
    with quickstart.local_retriever(retriever):
        cmd = [sys.executable, "-m", "verl.trainer.main_eval", *defaults, *overrides]
        print("+ " + shlex.join(cmd), flush=True)
        return run_child(cmd, cwd=REPO)  # main_eval stops itself on SIGINT/SIGTERM, then the retriever stops


if __name__ == "__main__":
    sys.exit(run_or_exit(main))
