"""Entry point of evaluation: ``python -m verl.trainer.main_eval key=value ...`` (``bash evaluate.sh``).

Greedy (``rollout.val_kwargs``), multi-turn, with search, through the trainer's own validation
(``RayPPOTrainer.validate`` -> :mod:`verl.trainer.ppo.validation`): the same agent loop,
prompt and reward as training, on rollout-only workers (no FSDP actor, optimizer, reference or
critic). It evaluates ``actor_rollout_ref.model.path`` (a checkpoint's ``huggingface/`` export, its
``global_step_N`` folder, or a hub id) on ``data.val_files`` and writes to ``evaluation.output_dir``:

    questions.jsonl   one record per question: question, gold, full trajectory, extracted answer, EM, ...
    evaluation.json   the per-source table (EM and its 95% bootstrap interval, format score when the
                      format reward is on, count, searches and response tokens per question), the
                      Search-R1 Table-2 average (mean of per-source EMs), settings, commit, command
    evaluation.md     the same table in Markdown (also printed)
    report.html       with ``evaluation.html=true`` (``evaluate.sh --html``): the table and every
                      question's trajectory, with filters (the environment's report)

Inputs are checked first (model, parquet columns, retriever), each failing with one line.
``trainer.val_only=true`` through ``main_ppo`` (Search-R1's ``evaluate.sh``) still works and
reports the same ``val/*`` metrics without the table.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

from dataclasses import asdict
from typing import Sequence

from verl.trainer.evaluation import inputs, report
from verl.trainer.ppo.config import PPOConfig, environment_of
from verl.trainer.run_exit import run_or_exit
from verl.utils.config import replace_key

REPO = Path(__file__).resolve().parents[2]


def prepare(cfg: PPOConfig) -> tuple[PPOConfig, list[str]]:
    """Check the inputs; return the config with the resolved model path, the per-source selection
    as ``data.val_files`` and the output folder, plus the evaluation files as given.

    Raises:
        ValueError: a missing model, data without the expected columns, or a tool of the environment
            that does not answer (Search-R1's: no retriever at ``retriever.url`` with ``do_search``).
    """
    files = [cfg.data.val_files] if isinstance(cfg.data.val_files, str) else list(cfg.data.val_files)
    model = inputs.resolve_model(str(cfg.actor_rollout_ref.model.path))
    for file in files:
        inputs.check_parquet(file, cfg.data.prompt_key)
    environment_of(cfg).check_ready(cfg)
    out_dir = cfg.evaluation.output_dir
    if out_dir is None:
        out_dir = inputs.default_output_dir(model, files)
        if cfg.evaluation.max_per_source is not None:
            out_dir = out_dir.with_name(f"{out_dir.name}-first{cfg.evaluation.max_per_source}")
    out_dir = Path(out_dir).resolve()
    selected = inputs.select_per_source(files, cfg.evaluation.max_per_source, out_dir / "questions.parquet")
    for key, value in {"actor_rollout_ref.model.path": model, "data.val_files": selected,
                       "evaluation.output_dir": str(out_dir), "trainer.validation_data_dir": str(out_dir),
                       "actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.rollout.n_agent": 1}.items():
        cfg = replace_key(cfg, key, value)
    return cfg, files


def build_evaluator(cfg: PPOConfig):
    """A ``RayPPOTrainer`` that can only validate: rollout workers, the validation data and reward."""
    from verl.trainer.ppo.data_loading import iterate_in_order
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.rollout_adapter import WorkerGroupEngine
    from verl.trainer.ppo.run_plan import make_run_plan
    from verl.trainer.ppo.trainer_setup import (build_dataset, build_environment, build_reward_fn, build_rollout,
                                                load_tokenizer, seed_everything)
    from verl.trainer.ppo.worker_setup import build_worker_groups
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.utils.tracking import Tracking

    seed_everything(cfg.trainer.seed)
    tokenizer = load_tokenizer(cfg)
    env = build_environment(cfg, tokenizer)
    val_set = build_dataset(cfg.data.val_files, tokenizer, cfg, cfg.data.val_data_num, env)
    plan = make_run_plan(cfg, batches_per_epoch=0)
    workers = build_worker_groups(cfg, plan, rollout_only=True)
    engine = WorkerGroupEngine(workers.actor_rollout, world_size=plan.data_parallel_size)
    val_batch_size = cfg.data.val_batch_size
    trainer = RayPPOTrainer(
        cfg, plan, tokenizer, workers, train_loader=None,
        val_batches=lambda: iterate_in_order(val_set, collate_fn, val_batch_size),
        rollout=build_rollout(cfg, tokenizer, engine, plan, env), reward_fn=None,
        val_reward_fn=build_reward_fn(env, tokenizer, 0), kl_ctrl=None,
        tracker=Tracking(cfg.trainer.project_name, cfg.trainer.experiment_name, [], cfg.evaluation.output_dir))
    trainer.global_step = inputs.checkpoint_step(cfg.actor_rollout_ref.model.path)
    return trainer


def run_eval(cfg: PPOConfig, data_files: list[str]) -> dict:
    """Evaluate a prepared config (:func:`prepare`; ``data_files`` as given); write and print the
    table. Returns the JSON."""
    trainer = build_evaluator(cfg)
    try:
        metrics = trainer.validate()
    finally:
        trainer.shutdown()
    out_dir = Path(cfg.evaluation.output_dir)
    questions = out_dir / "questions.jsonl"
    (out_dir / f"{trainer.global_step}.jsonl").replace(questions)
    from verl.trainer.ppo.validation import read_records

    env = environment_of(cfg)
    records = read_records(questions)
    table = report.summarise(records, env.describe(cfg).get("format_reward", False), cfg.evaluation.num_resamples)
    result = {"model": cfg.actor_rollout_ref.model.path, "step": trainer.global_step,
              "data": [str(Path(f).resolve()) for f in data_files], "max_per_source": cfg.evaluation.max_per_source,
              "settings": settings(cfg), "metrics": metrics, "table": table, **provenance()}
    (out_dir / "evaluation.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (out_dir / "evaluation.md").write_text(text + "\n")
    written = [out_dir / "evaluation.md", out_dir / "evaluation.json", questions]
    write_report = env.report_writer() if cfg.evaluation.html else None
    if write_report is not None:
        written.append(write_report(records, out_dir / "report.html",
                                    f"Evaluation of {result['model']} (step {result['step']})", out_dir.name, table=table,
                                    details=(f"{result['date']}, commit {str(result['commit'])[:10]}", str(questions))))
    print(f"\n{text}\n\nwrote {', '.join(map(str, written[:-1]))} and {written[-1]}", flush=True)
    return result


def settings(cfg: PPOConfig) -> dict:
    """What decides the numbers besides the model and the data (the environment's settings included)."""
    return {"env": cfg.env.name, "max_turns": cfg.max_turns, **environment_of(cfg).describe(cfg),
            "max_prompt_length": cfg.data.max_prompt_length,
            "max_response_length": cfg.data.max_response_length, "max_obs_length": cfg.data.max_obs_length,
            "rollout": cfg.actor_rollout_ref.rollout.name, "sampling": asdict(cfg.actor_rollout_ref.rollout.val_kwargs),
            "reward_model": asdict(cfg.reward_model)}


def provenance() -> dict:
    """Date, commit and command of this evaluation."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {"date": datetime.date.today().isoformat(), "commit": commit or None,
            "command": " ".join([sys.executable, "-m", "verl.trainer.main_eval", *sys.argv[1:]])}


def markdown(result: dict) -> str:
    """Title lines (model, step, data, date, commit) and the table."""
    head = [f"## Evaluation of `{result['model']}` (step {result['step']})", "",
            f"Data: {', '.join(f'`{d}`' for d in result['data'])}; greedy, max_turns {result['settings']['max_turns']}, "
            f"{result['settings'].get('summary', 'environment ' + result['settings']['env'])}; "
            f"{result['date']}, commit {str(result['commit'])[:10]}."]
    if result["max_per_source"] is not None:
        head[-1] += f" First {result['max_per_source']} questions of each source."
    return "\n".join(head) + "\n\n" + report.to_markdown(result["table"])


def main(argv: Sequence[str] | None = None) -> None:
    from verl.trainer.main_ppo import parse_config

    try:
        cfg, data_files = prepare(parse_config(sys.argv[1:] if argv is None else argv))
    except ValueError as error:  # ConfigError included
        # The message names the culprit (key, file, URL); a traceback would only hide it.
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    run_or_exit(lambda: run_eval(cfg, data_files),
                stopped=lambda: ": workers and Ray shut down; the evaluation was not written")


if __name__ == "__main__":
    main()
