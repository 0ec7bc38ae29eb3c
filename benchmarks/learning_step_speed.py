"""Step time of the learning recipe (issue 33 part 1): per-phase medians of variants, back to back.

Each variant is a short GRPO run of ``benchmarks/learning_run.py``'s recipe (SmolLM2-135M warm start,
64 prompts x 8 samples, 2 search turns of 320 tokens, observations of 384, BM25 over the shared
corpus, Search-R1's format reward) through ``train_grpo.sh``, differing only in speed settings
(``VARIANTS``: none changes the loss, the data or the sampling distribution). Per variant: the
``timing_s/*`` metrics of every step, their medians over the steps after the first, the first step
and the start-up (process start to the first logged step), and a host-speed probe taken right
before it (the device host is shared and its speed moves run to run).

    # one H200, after the wheels (../shared/device/README.md, --vllm) and learning data are in place
    python benchmarks/learning_step_speed.py --variants before,after --steps 8 --out_dir $OUT
    # one variant at a time across calls (results merge into the same JSON under --work_dir)
    python benchmarks/learning_step_speed.py --variants after --steps 8 --out_dir $OUT
    # host-side profile of one variant's workers (py-spy raw stacks of the steps after the first)
    python benchmarks/learning_step_speed.py --variants before --steps 6 --pyspy_s 30 --out_dir $OUT

Writes ``<out_dir>/learning_step_speed.json``: ``variants`` (name -> overrides, per-step timings,
``median``, ``first_step_s``, ``startup_s``, ``host_probe_ms``), ``ratio_step`` (median step of the
first variant / each other one's), ``meta`` (commit, command, machine, versions). With ``--pyspy_s``
also ``<out_dir>/pyspy_<variant>_<role>.txt`` (py-spy's collapsed stacks) and a summary of the
hottest frames in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))

import learning_check  # noqa: E402
import learning_run  # noqa: E402
from common import run_metadata  # noqa: E402
from gpu_generation import host_probe_ms  # noqa: E402

# Speed settings only. "before" is the tree and settings the learning recipe ran with when its step
# took 12.8 s (commit d511d1f: engine released and re-created around every update, 16k-token
# micro-batches); its tree is a `git archive` of that commit under --trees_dir. The others run this tree.
BASELINE_COMMIT = "d511d1f"
VARIANTS = {
    "before": {"tree": BASELINE_COMMIT, "overrides": ["actor_rollout_ref.rollout.free_cache_engine=true",
                                                      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384"]},
    "before_settings": {"tree": None, "overrides": ["actor_rollout_ref.rollout.free_cache_engine=true",
                                                    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384"]},
    "after": {"tree": None, "overrides": ["actor_rollout_ref.rollout.free_cache_engine=false",
                                          "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=65536"]},
    # the speed settings on the code before the controller-side changes (observation cache, one
    # retrieval per distinct query, vectorised padding, batched reward decode) and FlatLogprobs
    "after_693915d": {"tree": "693915d", "overrides": ["actor_rollout_ref.rollout.free_cache_engine=false",
                                                       "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=65536"]},
    # next candidates: eager layers (no ~45 s of compilation in step 1), 128k-token micro-batches
    "after_eager": {"tree": None, "overrides": ["actor_rollout_ref.rollout.free_cache_engine=false",
                                                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=65536",
                                                "actor_rollout_ref.actor.use_torch_compile=false"]},
    "after_128k": {"tree": None, "overrides": ["actor_rollout_ref.rollout.free_cache_engine=false",
                                               "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=131072"]},
    "after_unseeded": {"tree": None, "overrides": ["actor_rollout_ref.rollout.free_cache_engine=false",
                                                   "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=65536",
                                                   "actor_rollout_ref.rollout.seed_per_request=false"]},
}
PHASES = ("gen", "gen_engine", "tool", "reward", "old_log_prob", "ref", "adv", "update_actor",
          "release_memory", "weight_sync", "step")


def base_name(name: str) -> str:
    """``NAME@K`` (the K-th repeat of a variant, reported under its own key) -> ``NAME``."""
    return name.split("@", 1)[0]


def variant_overrides(name: str, steps: int, log_dir: Path, profile: str = "gpu") -> list[str]:
    """The learning recipe (as learning_run.py trains it) + the variant's speed settings."""
    return [*learning_run.TRAIN[profile], *learning_run.ROLLOUT[profile], *learning_check.FORMAT_REWARD,
            *VARIANTS[base_name(name)]["overrides"], f"trainer.total_training_steps={steps}", "trainer.save_freq=-1", "trainer.test_freq=-1",
            "trainer.val_before_train=false", "trainer.resume_mode=disable", "trainer.export_hf=false",
            "trainer.logger=[console,jsonl]", f"trainer.log_dir={log_dir}",
            f"trainer.experiment_name=step-speed-{base_name(name)}"]


def read_steps(log_dir: Path) -> list[dict]:
    path = log_dir / "metrics.jsonl"
    return learning_check.read_metrics(path) if path.exists() else []


def worker_pids(root_pid: int) -> dict[str, int]:
    """The trainer's driver process and its Ray actor-rollout worker (by command line)."""
    import psutil

    found = {"driver": root_pid}
    try:
        for child in psutil.Process(root_pid).children(recursive=True):
            cmd = " ".join(child.cmdline())
            if "ray::" in cmd and "WorkerHost" in cmd and "worker" not in found:
                found["worker"] = child.pid
    except psutil.Error:
        pass
    return found


def record_pyspy(pids: dict[str, int], seconds: float, out_dir: Path, variant: str) -> list[subprocess.Popen]:
    """Start ``py-spy record`` (raw collapsed stacks, native frames off) on each process."""
    exe = shutil.which("py-spy") or str(Path(sys.prefix, "bin", "py-spy"))
    site_exe = Path(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or ".", "bin", "py-spy")
    exe = str(site_exe) if site_exe.exists() else exe
    procs = []
    for role, pid in pids.items():
        out = out_dir / f"pyspy_{variant.replace('@', '-')}_{role}.txt"
        procs.append(subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                                       "--rate", "200", "--format", "raw", "--nonblocking", "-o", str(out)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    return procs


def hottest(path: Path, top: int = 25) -> dict:
    """Self and inclusive sample shares of the most frequent frames in a collapsed-stack file."""
    if not path.exists():
        return {}
    self_counts, incl_counts, total = Counter(), Counter(), 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        total += n
        self_counts[frames[-1]] += n
        for frame in set(frames):
            incl_counts[frame] += n
    share = lambda c: [[frame, round(v / total, 4)] for frame, v in c.most_common(top)]  # noqa: E731
    return {"samples": total, "self": share(self_counts), "inclusive": share(incl_counts)}


def run_variant(name: str, args, data: Path, warm_start: str, url: str, work_dir: Path) -> dict:
    log_dir = work_dir / name / "logs"
    shutil.rmtree(work_dir / name, ignore_errors=True)
    probe = host_probe_ms()
    tree = variant_tree(name, Path(args.trees_dir))
    cmd = ["bash", "train_grpo.sh", *variant_overrides(name, args.steps, log_dir, args.profile), *args.extra]
    env = learning_run.child_env(args, warm_start, url, data, CKPT_DIR=str(work_dir / name / "ckpt"),
                                 EXPERIMENT_NAME=f"step-speed-{base_name(name)}")
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *[p for p in env["PYTHONPATH"].split(os.pathsep)
                                                      if p and Path(p).resolve() != ROOT]])
    print(f"+ (in {tree}) " + " ".join(cmd), flush=True)
    started = time.time()
    out_dir = Path(args.out_dir)
    with open(work_dir / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=tree, env=env, process_group=0, stdout=log, stderr=subprocess.STDOUT)
        first_seen, spies = None, []
        while proc.poll() is None and time.time() - started < args.timeout_s:
            rows = read_steps(log_dir)
            if rows and first_seen is None:
                first_seen = time.time()
                if args.pyspy_s:
                    spies = record_pyspy(worker_pids(proc.pid), args.pyspy_s, out_dir, name)
            time.sleep(1.0)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        for spy in spies:
            spy.wait(timeout=args.pyspy_s + 60)
    rows = read_steps(log_dir)
    tail = (work_dir / f"{name}.log").read_text().splitlines()[-40:]
    variant = VARIANTS[base_name(name)]
    result = {"tree": variant["tree"] or "this commit", "overrides": variant["overrides"] + list(args.extra), "host_probe_ms": round(probe, 2),
              "returncode": proc.returncode, "wall_s": round(time.time() - started, 1), "steps_logged": len(rows),
              "steps": [{"step": r["step"], **{f"{p}_s": r.get(f"timing_s/{p}") for p in PHASES},
                         "num_micro_batches": r.get("actor/num_micro_batches"),
                         "decode_steps": r.get("perf/rollout_decode_steps"), "engine_calls": r.get("perf/rollout_engine_calls"),
                         "response_length": r.get("response_length/mean"), "score": r.get("critic/score/mean"),
                         "tokens": r.get("perf/total_num_tokens")} for r in rows]}
    if rows:
        result["first_step_s"] = rows[0].get("timing_s/step")
        result["startup_s"] = round((first_seen or time.time()) - started - (rows[0].get("timing_s/step") or 0), 1)
        result["median"] = medians(rows[1:] or rows)
    if proc.returncode not in (0, None):
        result["log_tail"] = tail
    if args.pyspy_s:
        result["pyspy"] = {role: hottest(out_dir / f"pyspy_{name.replace('@', '-')}_{role}.txt")
                           for role in ("driver", "worker")}
    return result


def variant_tree(name: str, trees_dir: Path) -> Path:
    """The source tree a variant runs: this one, or ``trees_dir/<commit>`` (``git archive`` of it,
    made here when the folder is missing and this is a git checkout).

    Raises:
        FileNotFoundError: the commit's tree is neither there nor can be made.
    """
    commit = VARIANTS[base_name(name)]["tree"]
    if commit is None:
        return ROOT
    tree = trees_dir / commit
    if not (tree / "train_grpo.sh").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True)
        if archive.returncode:
            raise FileNotFoundError(f"variant {name}: no tree at {tree} and `git archive {commit}` failed: "
                                    f"{archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def medians(rows: list[dict]) -> dict:
    import numpy as np

    out = {}
    for phase in PHASES:
        values = [r[f"timing_s/{phase}"] for r in rows if r.get(f"timing_s/{phase}") is not None]
        if values:
            out[phase] = {"median": round(float(np.median(values)), 3), "min": round(min(values), 3),
                          "max": round(max(values), 3), "n": len(values)}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="before,after",
                        help=f"comma-separated names of {sorted(VARIANTS)}; NAME@K repeats NAME under its own key")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--work_dir", default="/tmp/step_speed")
    parser.add_argument("--out_dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--data", default=str(ROOT / "data" / "learning"), help="a benchmarks/learning_data.py output")
    parser.add_argument("--trees_dir", default=str(ROOT / ".bench" / "trees"),
                        help="source trees of variants that run another commit (git archive, made when missing)")
    parser.add_argument("--model", default=None, help="initial policy (default: the SFT warm start)")
    parser.add_argument("--timeout_s", type=float, default=540.0, help="per variant")
    parser.add_argument("--pyspy_s", type=float, default=0.0, help="py-spy the driver and worker for N s from step 1")
    parser.add_argument("--profile", choices=("gpu", "cpu"), default="gpu",
                        help="cpu: learning_run's CPU sizes (the benchmark's own test; machinery, not speed)")
    parser.add_argument("--retriever", default="bm25", help=argparse.SUPPRESS)
    parser.add_argument("extra", nargs="*", help="key=value overrides added to every variant")
    args = parser.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if base_name(n) not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    data = learning_run.prepare_data(args, work_dir)
    warm_start = args.model or __import__("warm_start").ensure_warm_start()
    state = work_dir / "learning_step_speed.json"
    report = json.loads(state.read_text()) if state.exists() else {"variants": {}}
    with learning_run.start_retriever(args, data, work_dir) as server:
        for name in names:
            report["variants"][name] = run_variant(name, args, data, warm_start, server.retrieve_url, work_dir)
            state.write_text(json.dumps(report, indent=1) + "\n")
    report["meta"] = run_metadata()
    report["meta"]["steps_per_variant"] = args.steps
    report["ratio_step"] = ratios(report["variants"])
    state.write_text(json.dumps(report, indent=1) + "\n")
    shutil.copy(state, Path(args.out_dir) / "learning_step_speed.json")
    for name, variant in report["variants"].items():
        print(name, json.dumps({k: v["median"] for k, v in variant.get("median", {}).items()}), flush=True)
    print("ratio_step", report["ratio_step"], flush=True)
    return 0


def ratios(variants: dict) -> dict:
    """Median step of the first variant over each other variant's (> 1: faster than the first)."""
    steps = {n: v["median"]["step"]["median"] for n, v in variants.items() if "step" in v.get("median", {})}
    if not steps:
        return {}
    base_name = next(iter(steps))
    return {n: round(steps[base_name] / s, 3) for n, s in steps.items() if n != base_name}


if __name__ == "__main__":
    sys.exit(main())
