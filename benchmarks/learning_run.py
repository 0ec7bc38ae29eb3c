"""The learning run of issue 19 part 2: GRPO or PPO (GAE + critic) from the user entry points, resumable
across the device's 10-minute calls, with ``evaluate.sh`` on the fixed validation set at chosen steps.

    # one H200; call again with the same arguments until it prints "learning run: done"
    python benchmarks/learning_run.py --algo grpo --steps 150 --budget_s 520 --work_dir /tmp/learning --out_dir $OUT
    python benchmarks/learning_run.py --algo gae  --steps 150 --budget_s 520 --work_dir /tmp/learning --out_dir $OUT
    # a preset stacked on the algorithm's recipe (docs/recipes.md): results go to learning_grpo+search_r1pp.json
    python benchmarks/learning_run.py --algo grpo --recipes search_r1pp --steps 150 --budget_s 520 \
        --work_dir /tmp/learning --out_dir $OUT
    # side-by-side report of finished runs (Markdown for docs/benchmarks_learning.md)
    python benchmarks/learning_run.py --report benchmarks/results/learning_grpo.json benchmarks/results/learning_gae.json
    # a hold that ended before the JSON: rebuild it from a device poll's files (the run's own arguments)
    python benchmarks/learning_run.py --algo grpo --recipes search_r1pp --eval_in_trainer --returned /work/.device/14

Every call does, within ``--budget_s`` seconds:

1. data: ``<work_dir>/data`` (copied once from ``--data``, a ``benchmarks/learning_data.py`` output, or
   built from ``../shared/data``), the SFT warm start (``scripts/warm_start.py``, cached) as step 0;
2. a retrieval server over the whole shared corpus (``--retriever bm25|dense``; index built once);
3. ``bash evaluate.sh`` for every step of ``--eval_steps`` whose checkpoint export exists and has no
   result yet (step 0: the warm start itself), each only when the time it is expected to take (the
   longest evaluation so far, ``eval_s`` in ``<work_dir>/<algo>/state.json``; step 0's first) is left
   in the budget; one that is not is reported in the call's log and runs first in the next call;
4. ``bash train_grpo.sh`` / ``train_ppo.sh`` with ``trainer.resume_mode=auto`` and
   ``trainer.max_time_s`` set to the budget left, less the time kept for the evaluations still due
   (every evaluation step reached and not yet evaluated, plus the next one training may reach:
   :func:`reserved_s`) and the stop grace: the trainer ends itself at the last step that fits, with a
   checkpoint there (and, with ``--eval_in_trainer``, its validation: the JSON's last evaluation), so
   the next call resumes from it. Should it overrun, SIGTERM to its process group, then SIGKILL
   (checkpoints are written atomically: the next call resumes from the last one); then evaluations again;
5. removal of checkpoints that are neither the latest nor an evaluation step still to evaluate, and
   ``<out_dir>/learning_<algo>.json`` (+ ``.png``): ``algorithm``, ``steps``, the evaluation tables by
   step, comparisons with step 0, the training curves, the step-time split, the commands.

With ``--eval_in_trainer`` the trainer evaluates instead (step 3 runs only for a step training
missed): validation of the same questions at the evaluation steps with its own engine, each step's
per-question dump turned into ``evaluation.json`` as ``evaluate.sh`` would write its table; no engine
start-up per evaluation, and no time kept for the next evaluation while training runs.

The same rollout settings (lengths, turns, reward, engine length) go to training and evaluation.
``--profile cpu`` shrinks everything for the CPU test of this wrapper (machinery, not learning).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))

import learning_check  # noqa: E402  (its CPU sizes and the format reward)
from gpu_generation import host_probe_ms  # noqa: E402
from learning_report import CURVES, plot, report, side_by_side  # noqa: E402
from verl.trainer.overrides import recipe_overrides  # noqa: E402

SCRIPTS = {"grpo": "train_grpo.sh", "gae": "train_ppo.sh"}
TIMINGS = ("gen", "tool", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "step")

# Rollout as both training and evaluation see it: contexts fit 3 passages of 100 words per search.
# The GPU profile is the learning recipe (verl/trainer/config/recipe/learning_gpu*.yaml), passed as
# key=value overrides so that a baseline checkout older than recipes runs it too.
ROLLOUT = {
    "gpu": recipe_overrides("learning_gpu_rollout"),
    "cpu": ["data.max_prompt_length=768", "data.max_start_length=256", "data.max_response_length=16",
            "data.max_obs_length=64", "max_turns=2", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.dtype=float32"],
}
TRAIN = {
    "gpu": recipe_overrides("learning_gpu"),
    "cpu": [*learning_check.CPU_ARGS, "trainer.backend=local", "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size=4",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size=4", "actor_rollout_ref.ref.log_prob_micro_batch_size=4",
            "critic.ppo_micro_batch_size=4", "critic.model.fsdp_config.param_offload=false",
            "critic.model.fsdp_config.optimizer_offload=false",
            "critic.model.fsdp_config.mixed_precision=fp32", "critic.model.enable_gradient_checkpointing=false"],
}
VAL_BATCH = {"gpu": 1000, "cpu": 16}  # validation questions a generation call (both ways of evaluating)
EVAL = {"gpu": [f"data.val_batch_size={VAL_BATCH['gpu']}", "actor_rollout_ref.rollout.enforce_eager=true",
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.5"],
        "cpu": [f"data.val_batch_size={VAL_BATCH['cpu']}", "trainer.backend=local"]}
STOP_GRACE_S = 30.0  # what run_until allows a stopped child after SIGTERM: kept in the budget too


class Run:
    """The paths of one algorithm's run under ``<work_dir>/<algo>``."""

    def __init__(self, work_dir: Path, algo: str):
        self.root = work_dir / algo
        self.ckpt, self.logs, self.evals = self.root / "ckpt", self.root / "logs", self.root / "evals"
        self.calls = self.root / "calls.json"
        self.validations = self.root / "val"  # the trainer's per-question dumps (--eval_in_trainer)
        self.state = self.root / "state.json"

    def latest_step(self) -> int:
        pointer = self.ckpt / "latest_checkpointed_iteration.txt"
        return int(pointer.read_text().strip()) if pointer.exists() else 0

    def export(self, step: int) -> Path:
        return self.ckpt / f"global_step_{step}" / "huggingface"

    def evaluation(self, step: int) -> Path:
        return self.evals / str(step) / "evaluation.json"

    def eval_seconds(self) -> float | None:
        """The longest evaluation measured so far (None before the first)."""
        return json.loads(self.state.read_text()).get("eval_s") if self.state.exists() else None

    def record_eval_seconds(self, seconds: float) -> None:
        state = json.loads(self.state.read_text()) if self.state.exists() else {}
        state["eval_s"] = round(max(seconds, state.get("eval_s") or 0.0), 1)
        self.state.write_text(json.dumps(state) + "\n")


def reserved_s(args, run: Run) -> float:
    """Seconds of the budget kept for evaluations while training runs: one ``eval_s`` for every
    evaluation step reached and not evaluated, and one for the next evaluation step (training may
    reach it before it is stopped; not with ``--eval_in_trainer``, where training evaluates it), plus
    the stop grace. 0 before any evaluation was measured."""
    eval_s = run.eval_seconds()
    if eval_s is None:
        return 0.0
    latest = run.latest_step()
    due = sum(1 for s in args.eval_steps if 0 < s <= latest and not run.evaluation(s).exists())
    ahead = not args.eval_in_trainer and any(s > latest for s in args.eval_steps)
    return eval_s * (due + ahead) + STOP_GRACE_S


def rollout_overrides(args) -> list[str]:
    """Training's and evaluation's rollout: the profile's, the reward, the ``--recipes`` (as key=value;
    a recipe that sets ``reward_model.*`` replaces ``--reward``), then the extra overrides."""
    recipes = recipe_overrides(*args.recipes) if args.recipes else []
    recipe_reward = any(o.startswith("reward_model.") for o in recipes)
    reward = [] if args.reward == "em" or recipe_reward else list(learning_check.FORMAT_REWARD)
    return [*ROLLOUT[args.profile], *reward, *recipes, *args.extra]


def validation_overrides(args, run: Run) -> list[str]:
    """No validation in training; with ``--eval_in_trainer``, validation of the evaluation set
    (``<data>/test.parquet``, the trainer's default) at the evaluation steps: every gcd of them,
    before training when step 0 is one, each dumped per question to ``<run>/val/<step>.jsonl``."""
    if not args.eval_in_trainer:
        return ["trainer.test_freq=-1", "trainer.val_before_train=false"]
    positive = [s for s in args.eval_steps if s > 0]
    return [f"trainer.test_freq={math.gcd(*positive) if positive else -1}",
            f"trainer.val_before_train={str(0 in args.eval_steps).lower()}",
            f"data.val_batch_size={VAL_BATCH[args.profile]}", f"trainer.validation_data_dir={run.validations}"]


def train_overrides(args, run: Run, max_time_s: float | None = None) -> list[str]:
    """Training's overrides; ``max_time_s``: the trainer's own time limit (``trainer.max_time_s``),
    unless the extra overrides set one."""
    given = any(o.startswith("trainer.max_time_s=") for o in args.extra)
    limit = [f"trainer.max_time_s={max(max_time_s, 1.0):.0f}"] if max_time_s and not given else []
    return [*TRAIN[args.profile], *rollout_overrides(args), f"trainer.total_training_steps={args.steps}",
            f"trainer.save_freq={args.save_freq}", *validation_overrides(args, run), "trainer.resume_mode=auto", "trainer.export_hf=true", "trainer.logger=[console,jsonl]",
            f"trainer.log_dir={run.logs}", f"trainer.experiment_name=learning-{args.label}", *limit]


def child_env(args, model: str, url: str, data: Path, **more) -> dict:
    gpus = "0" if args.profile == "cpu" else "1"
    return {**os.environ, "N_GPUS": gpus, "BASE_MODEL": model, "DATA_DIR": str(data), "RETRIEVER_URL": url,
            "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])),
            "WARM_START": "0",  # the model is BASE_MODEL; the train scripts' own warm-start hook stays off
            "VLLM_USE_FLASHINFER_SAMPLER": "0", "PYTHONUNBUFFERED": "1", **more}


def run_until(cmd: list[str], env: dict, deadline: float, stop_when=lambda: False, log=None) -> str:
    """Run ``cmd`` in its own process group until it exits, ``deadline`` (time.time()) passes or
    ``stop_when()`` holds; then SIGTERM the group, SIGKILL after 30 s. Returns ``"exit <rc>"`` or ``"stopped"``."""
    print("+ " + " ".join(cmd), flush=True)
    # its own process group (one signal reaches Ray, vLLM and the retriever children), same session:
    # the device still ends it if this call is cut short
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, process_group=0, stdout=log,
                            stderr=subprocess.STDOUT if log else None)
    while proc.poll() is None and time.time() < deadline and not stop_when():
        time.sleep(2.0)
    if proc.poll() is not None:
        return f"exit {proc.returncode}"
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    return "stopped"


def evaluate_pending(args, run: Run, warm_start: str, url: str, data: Path, deadline: float) -> list[str]:
    """``evaluate.sh`` for each evaluation step that has a model and no result, when its expected
    time is left before ``deadline``; returns what ran, and what did not fit and why."""
    done = []
    for step in args.eval_steps:
        model = warm_start if step == 0 else str(run.export(step))
        if run.evaluation(step).exists() or not Path(model, "config.json").exists():
            continue
        expected, left = run.eval_seconds(), deadline - time.time()
        if left <= 0 or (expected is not None and expected > left):
            done.append(f"evaluate step {step}: not run: it takes ~{expected or 0:.0f} s and {max(left, 0):.0f} s "
                        f"are left in this call's budget; the next call runs it first")
            continue
        cmd = ["bash", "evaluate.sh", *rollout_overrides(args), *EVAL[args.profile]]
        if args.eval_max_per_source:
            cmd += ["--max_per_source", str(args.eval_max_per_source)]
        env = child_env(args, model, url, data, OUTPUT_DIR=str(run.evals / str(step)))
        started = time.time()
        outcome = run_until(cmd, env, deadline)
        if run.evaluation(step).exists():
            run.record_eval_seconds(time.time() - started)
        done.append(f"evaluate step {step}: {outcome}")
    return done


def adopt_validations(args, run: Run) -> list[str]:
    """``evaluation.json`` for each evaluation step the trainer validated (``--eval_in_trainer``): the
    table of its per-question dump, computed as ``evaluate.sh`` computes its own."""
    from verl.trainer.evaluation.report import summarise
    from verl.trainer.ppo.validation import read_records

    format_reward = any(o.startswith("reward_model.") for o in rollout_overrides(args))
    done = []
    for step in sorted(int(p.stem) for p in run.validations.glob("*.jsonl") if p.stem.isdigit()):
        dump, target = run.validations / f"{step}.jsonl", run.evaluation(step)
        if target.exists() or not dump.exists():
            continue
        records = read_records(dump)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(dump, target.parent / "questions.jsonl")
        target.write_text(json.dumps({"step": step, "evaluated_by": "the trainer's validation",
                                      "table": summarise(records, format_reward)}, indent=1) + "\n")
        done.append(f"evaluate step {step}: the trainer's validation ({len(records)} questions)")
    return done


def prune(args, run: Run) -> None:
    """Delete step folders that are neither the latest nor an evaluation step still to evaluate."""
    latest = run.latest_step()
    for folder in run.ckpt.glob("global_step_*"):
        step = int(folder.name.rsplit("_", 1)[1])
        wanted = step in args.eval_steps and not run.evaluation(step).exists()
        if step != latest and not wanted:
            shutil.rmtree(folder, ignore_errors=True)


def prepare_data(args, work_dir: Path) -> Path:
    """``<work_dir>/data``: a copy of ``--data`` (the device keeps /tmp between calls, not carried paths)."""
    target = work_dir / "data"
    if (target / "selection.json").exists():
        return target
    if args.data and (Path(args.data) / "selection.json").exists():
        shutil.copytree(args.data, target, dirs_exist_ok=True)
    else:
        import learning_data

        learning_data.main(["--out", str(target)])
    return target


def start_retriever(args, data: Path, work_dir: Path):
    """A retrieval server over ``data/corpus.jsonl`` (index built once under ``<work_dir>/indexes``)."""
    from search_r1.search.launcher import launch_server

    corpus, index_dir = data / "corpus.jsonl", work_dir / "indexes"
    method = "minilm" if args.retriever == "dense" else "bm25"
    index = index_dir / ("minilm_Flat.index" if method == "minilm" else "bm25")
    if not Path(f"{index}.DONE").exists():
        # in a child process: this one never holds GPU memory while the trainer runs
        subprocess.run([sys.executable, "-m", "search_r1.search.index_builder", "--retrieval_method", method,
                        "--corpus_path", str(corpus), "--save_dir", str(index_dir), "--batch_size", "256"],
                       cwd=ROOT, env=child_env(args, "", "", data), check=True)
        Path(f"{index}.DONE").write_text("ok\n")
    return launch_server(["--retriever_name", method, "--index_path", str(index), "--corpus_path", str(corpus),
                          "--topk", "3"], startup_timeout=600)


def one_call(args) -> bool:
    """One budgeted call: evaluations due, training until the budget, evaluations, the report. Returns
    whether the run is complete."""
    started = time.time()
    deadline = started + args.budget_s
    # where the run is, written first: a hold that ends before the JSON leaves it in the log (adopt_returned)
    print(PROVENANCE_LINE + json.dumps({**provenance(), "host_probe_ms": round(host_probe_ms(), 1)}), flush=True)
    work_dir = Path(args.work_dir).resolve()
    run = Run(work_dir, args.label)
    run.root.mkdir(parents=True, exist_ok=True)
    data = prepare_data(args, work_dir)
    warm_start = args.model or __import__("warm_start").ensure_warm_start(multi_hop_searches=args.warm_start_searches)
    before, log, alarm = run.latest_step(), [], None
    with start_retriever(args, data, work_dir) as server:
        url = server.retrieve_url
        log += adopt_validations(args, run)
        if not (args.eval_in_trainer and run.latest_step() < args.steps):  # else training evaluates
            log += evaluate_pending(args, run, warm_start, url, data, deadline)
        left = deadline - time.time()
        if run.latest_step() < args.steps and left <= args.min_train_s + reserved_s(args, run):
            log.append(f"train: not started: {left:.0f} s left, less than --min_train_s {args.min_train_s:.0f} s "
                       f"+ {reserved_s(args, run):.0f} s kept for the evaluations due")
            if args.eval_in_trainer:
                log += evaluate_pending(args, run, warm_start, url, data, deadline)
        elif run.latest_step() < args.steps:
            # the trainer ends itself in time, at a step it validates (with --eval_in_trainer) and
            # checkpoints; stop_when below stays as the backstop
            max_time_s = left - reserved_s(args, run) - STOP_GRACE_S
            cmd = ["bash", SCRIPTS[args.algo], *train_overrides(args, run, max_time_s)]
            env = child_env(args, warm_start, url, data, CKPT_DIR=str(run.ckpt), EXPERIMENT_NAME=f"learning-{args.label}")
            limit = before + args.max_new_steps if args.max_new_steps else None

            def stop_when() -> bool:  # a step limit, or only the evaluations' time left
                return (limit is not None and run.latest_step() >= limit) or \
                    time.time() + reserved_s(args, run) >= deadline

            outcome = run_until(cmd, env, deadline, stop_when=stop_when)
            log.append(f"train {before} -> {run.latest_step()}: {outcome}")
            alarm = health_stop_step(run) if outcome == "exit 1" else None
            if alarm is not None:
                log.append(f"train: stopped by a health alarm at step {alarm} (trainer.health.stop_on_alarm; "
                           f"the curves show what drifted)")
            log += adopt_validations(args, run)
            log += evaluate_pending(args, run, warm_start, url, data, deadline)
    prune(args, run)
    calls = json.loads(run.calls.read_text()) if run.calls.exists() else []
    calls.append({"started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
                  "seconds": round(time.time() - started, 1), "steps": [before, run.latest_step()], "log": log,
                  "host_probe_ms": round(host_probe_ms(), 1)})
    run.calls.write_text(json.dumps(calls, indent=1) + "\n")
    result = collect(args, run, warm_start, data)
    write_result(result, Path(args.out_dir), args.label)
    complete = run.latest_step() >= args.steps and all(run.evaluation(s).exists() for s in args.eval_steps)
    state = "done" if complete else f"stopped by a health alarm at step {alarm}" if alarm else "not done: call again"
    print("\n".join(log) + f"\nlearning run: {state} (step {run.latest_step()} of {args.steps})", flush=True)
    return complete


def health_stop_step(run: Run) -> int | None:
    """For a training call that exited 1: the step a health alarm ended it at
    (``trainer.health.stop_on_alarm``: the last logged step, not checkpointed, with ``health/alarm``
    1), or None."""
    path = run.logs / "metrics.jsonl"
    rows = learning_check.read_metrics(path) if path.exists() else []
    if rows and rows[-1].get("health/alarm") == 1.0 and rows[-1]["step"] > run.latest_step():
        return int(rows[-1]["step"])
    return None


def collect(args, run: Run, warm_start: str, data: Path) -> dict:
    """The run's JSON (see the module docstring); ``steps_seen`` is the last step with metrics (past
    ``steps``, the last checkpoint, when a run was stopped between checkpoints)."""
    from verl.trainer.evaluation.report import compare

    rows = learning_check.read_metrics(run.logs / "metrics.jsonl") if (run.logs / "metrics.jsonl").exists() else []
    evaluations = {str(s): json.loads(run.evaluation(s).read_text()) for s in evaluated_steps(run)}
    comparisons = {f"{s}_vs_0": compare(evaluations["0"]["table"], e["table"]) for s, e in evaluations.items()
                   if s != "0" and "0" in evaluations}
    return {"algorithm": args.algo, "recipes": args.recipes, "label": args.label, "steps": run.latest_step(),
            "steps_seen": max((r["step"] for r in rows), default=0), "target_steps": args.steps, "eval_steps": args.eval_steps,
            "evaluations": evaluations, "comparisons": comparisons, "goal": goal(evaluations),
            "curves": [{"step": r["step"], **{k: r[k] for k in CURVES if k in r}} for r in rows],
            "step_time_s": step_times(rows), "profile": args.profile, "retriever": args.retriever, "reward": args.reward,
            "warm_start": warm_start, "data": json.loads((data / "selection.json").read_text())["counts"],
            "command": "python " + " ".join(sys.argv), "train_command": " ".join(["bash", SCRIPTS[args.algo], *train_overrides(args, run)]),
            "calls": json.loads(run.calls.read_text()) if run.calls.exists() else [], **provenance()}


def adopt_returned(args, returned: Path) -> dict:
    """The run's JSON rebuilt from what a device poll brought back (``benchmarks/device/learning_run.sh``
    sends ``metrics_<label>.jsonl.gz`` and ``val_<label>.tgz``, ``+`` written ``_``), for a hold that
    ended before the run wrote its own: the evaluations of the trainer's per-question dumps, the curves
    and step times of the metrics, the device's commit, machine and host probe of the ``run.log.txt``
    beside them. Its ``status`` says so; ``steps`` is then the last step with metrics.

    Raises:
        FileNotFoundError: ``returned`` lacks the metrics file (the message names it).
    """
    import gzip
    import tarfile
    import tempfile

    name = args.label.replace("+", "_")
    metrics, dumps = returned / f"metrics_{name}.jsonl.gz", returned / f"val_{name}.tgz"
    if not metrics.exists():
        raise FileNotFoundError(f"--returned {returned}: no {metrics.name} (the run is named {args.label!r})")
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(Path(tmp), args.label)
        run.logs.mkdir(parents=True)
        (run.logs / "metrics.jsonl").write_bytes(gzip.decompress(metrics.read_bytes()))
        if dumps.exists():
            with tarfile.open(dumps) as tar:
                tar.extractall(run.root, filter="data")
        adopt_validations(args, run)
        result = collect(args, run, "built on the device by scripts/warm_start.py", Path(args.data))
    result["steps"] = result["steps_seen"]
    log = returned / "run.log.txt"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    device = [json.loads(x[len(PROVENANCE_LINE):]) for x in lines if x.startswith(PROVENANCE_LINE)]
    if device:  # the device's commit, machine and host probe, not this machine's
        result.update(device[-1])
    result["status"] = (f"partial: rebuilt from {metrics.name}{' and ' + dumps.name if dumps.exists() else ''}; "
                        f"the hold ended at step {result['steps_seen']} before the run wrote its JSON")
    return result


def evaluated_steps(run: Run) -> list[int]:
    """Every step with an evaluation: those of ``--eval_steps`` and the one a time limit ended training at."""
    return sorted(int(p.parent.name) for p in run.evals.glob("*/evaluation.json") if p.parent.name.isdigit())


def goal(evaluations: dict) -> dict:
    """Issue 19's goal: final average EM >= 2x the warm start's, with non-overlapping 95% intervals."""
    if "0" not in evaluations or len(evaluations) < 2:
        return {}
    first, last_step = evaluations["0"]["table"]["average"], max(evaluations, key=int)
    last = evaluations[last_step]["table"]["average"]
    return {"warm_start": first["em"], "final_step": int(last_step), "final": last["em"],
            "ratio": last["em"] / first["em"] if first["em"] else None,
            "intervals_overlap": not (last["em_ci"][0] > first["em_ci"][1]),
            "met": bool(first["em"] and last["em"] >= 2 * first["em"] and last["em_ci"][0] > first["em_ci"][1])}


def step_times(rows: list[dict]) -> dict:
    """Median seconds per phase over the steps that ran (``timing_s/*``)."""
    import numpy as np

    out = {}
    for phase in TIMINGS:
        values = [r[f"timing_s/{phase}"] for r in rows if f"timing_s/{phase}" in r]
        if values:
            out[phase] = float(np.median(values))
    return out


PROVENANCE_LINE = "provenance: "


def provenance() -> dict:
    return {"commit": learning_check.commit(), "machine": learning_check.machine(), "date": time.strftime("%Y-%m-%d")}


def write_result(result: dict, out_dir: Path, algo: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"learning_{algo}.json").write_text(json.dumps(result, indent=1) + "\n")
    try:
        plot(result, out_dir / f"learning_{algo}.png")
    except ImportError:
        print("matplotlib missing: no PNG", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", nargs="+", metavar="RUN.json", help="print the Markdown report of finished runs")
    parser.add_argument("--report_json", metavar="PATH", help="with --report: also write the runs side by side "
                        "(each against the first) as JSON, e.g. benchmarks/results/recipes_learning.json")
    parser.add_argument("--algo", choices=sorted(SCRIPTS), default="grpo", help="grpo, or gae (PPO with a critic)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--eval_steps", default="0,50,100,150", help="comma-separated steps evaluated by evaluate.sh")
    parser.add_argument("--eval_in_trainer", action="store_true",
                        help="evaluate inside training (trainer.test_freq, val_before_train; the trainer's own engine) "
                             "instead of an evaluate.sh process per step; evaluate.sh still runs a step training missed")
    parser.add_argument("--save_freq", type=int, default=10, help="checkpoint every N steps (the resume points)")
    parser.add_argument("--budget_s", type=float, default=520.0, help="seconds this call may take")
    parser.add_argument("--min_train_s", type=float, default=180.0, help="start training only with this much budget left")
    parser.add_argument("--max_new_steps", type=int, default=None, help="stop training after N more checkpointed steps")
    parser.add_argument("--work_dir", default="/tmp/learning", help="state kept between calls (checkpoints, evaluations)")
    parser.add_argument("--out_dir", default=str(ROOT / "benchmarks" / "results"), help="where learning_<algo>.json goes")
    parser.add_argument("--data", default=str(ROOT / "data" / "learning"), help="a benchmarks/learning_data.py output")
    parser.add_argument("--model", default=None, help="initial policy (default: the SFT warm start)")
    parser.add_argument("--warm_start_searches", type=int, choices=(1, 2), default=1,
                        help="2: the warm start whose multi-hop demonstrations search twice (scripts/warm_start.py "
                             "--multi_hop_searches 2); the run is named <algo>+2hop")
    parser.add_argument("--retriever", choices=("bm25", "dense"), default="bm25",
                        help="bm25 (no encoder wheel to carry) or dense: MiniLM Flat, a slightly higher ceiling "
                             "(benchmarks/results/learning_ceiling.json)")
    parser.add_argument("--reward", choices=("format", "em"), default="format",
                        help="format: Search-R1's qa_em_format (EM 1, format 0.2, retrieval 0.1); em: plain EM")
    parser.add_argument("--eval_max_per_source", type=int, default=None, help="evaluate.sh --max_per_source")
    parser.add_argument("--recipes", default="", help="comma-separated presets of verl/trainer/config/recipe/ stacked "
                        "on the algorithm's (e.g. search_r1pp, llds): training and evaluation both get them; the run "
                        "and its results are named <algo>+<recipe>...")
    parser.add_argument("--tag", default="", help="a name for the extra overrides, appended to the run's name "
                        "(e.g. mb32 for actor_rollout_ref.actor.ppo_mini_batch_size=32): its results do not "
                        "overwrite the run without them")
    parser.add_argument("--profile", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--returned", metavar="DIR", help="no run: rebuild learning_<label>.json in --out_dir from a "
                        "device poll's files in DIR (metrics_*.jsonl.gz, val_*.tgz), the same --algo/--recipes given")
    parser.add_argument("extra", nargs="*", help="key=value overrides for training and evaluation")
    args = parser.parse_args(argv)
    args.eval_steps = sorted({int(s) for s in args.eval_steps.split(",") if s.strip()})
    args.recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    if args.tag and not re.fullmatch(r"[A-Za-z0-9_-]+", args.tag):
        parser.error(f"--tag {args.tag!r}: letters, digits, '_' and '-' only (it names files)")
    args.label = "+".join([args.algo, *args.recipes, *(["2hop"] if args.warm_start_searches == 2 else []),
                           *([args.tag] if args.tag else [])])
    bad = [s for s in args.eval_steps if s and s % args.save_freq]
    if bad:
        parser.error(f"--eval_steps {bad} are not multiples of --save_freq {args.save_freq} (no checkpoint there)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        print(report(args.report))
        if args.report_json:
            Path(args.report_json).write_text(json.dumps(side_by_side(args.report), indent=1) + "\n")
        return 0
    if args.returned:
        write_result(adopt_returned(args, Path(args.returned)), Path(args.out_dir), args.label)
        return 0
    return 0 if one_call(args) else 3


if __name__ == "__main__":
    sys.exit(main())
