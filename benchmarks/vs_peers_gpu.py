"""Issue 27: the same GRPO step in this project, in veRL 0.9.1 and in TRL 1.16.0, back to back on one H200.

    # on the device, after benchmarks/device/vs_peers.sh STAGE=start installed everything
    python benchmarks/vs_peers_gpu.py --configs learning,qwen1.5b,search --systems ours,verl,trl --steps 5 \
        --data /tmp/vs_peers/data --warm_start DIR --work_dir /tmp/vs_peers --out_dir $OUT --budget_s 1200

Each system runs in a child process of its own, with its own site first on ``PYTHONPATH`` (veRL:
``/tmp/site-verl:/tmp/site``, TRL: ``/tmp/site-trl:/tmp/site``, ours: ``/tmp/site`` and this repo): this
project's package is also called ``verl``, so this script never imports a peer, and the peers run
from a folder outside the repo. All three: bf16 compute with fp32 master weights, one GPU, rollout by
vLLM colocated with training (veRL's hybrid engine with its async vLLM server; TRL's
``vllm_mode="colocate"``; ours in-process), GRPO with the low-variance KL loss (0.001) against a
reference model, one mini-batch a step, temperature 1, reward = exact match of the last ``<answer>``
(ours: ``search_r1``'s EM; the peers: ``benchmarks/peers/em_reward.py``, checked equal).

Configurations (:data:`CONFIGS`), single turn unless said: ``learning``, the learning recipe's shape
(SmolLM2-135M SFT warm start, 64 prompts x 8, prompts <= 320 and responses <= 320 tokens, lr 2e-5);
``qwen1.5b``, a randomly initialised Qwen2.5-1.5B shape (SmolLM2 tokenizer), 512 NQ/HotpotQA prompts with
Search-R1's prompt x 5, responses of 500 tokens (a random policy never stops early), lr 1e-6; ``search``,
``learning`` with the learning recipe's multi-turn search: turns of <= 320 tokens, ``max_turns=2`` searches,
observations of <= 384 tokens, BM25 top-3 over the learning data's corpus from ONE retriever server of ours
(``search_r1.search``, Search-R1's ``/retrieve`` API; started here as ``benchmarks/learning_run.py`` starts
it) whose URL every system gets: ours its own search rollout, veRL its ``ToolAgentLoop`` with
``benchmarks/peers/verl_search.py``'s search tool, tag parser and stop strings; TRL 1.16 has no multi-turn
rollout that fits (:data:`UNSUPPORTED`: the run is recorded as skipped with the reason, and
``ratio_absent`` names the missing ratio).

Speed settings, each system's own best documented ones: ours the learning recipe's (engine resident,
64k-token packed micro-batches, varlen attention, torch.compile), activation checkpointing only at 1.5B;
veRL's performance-tuning guide (docs/perf/perf_tuning.rst: ``use_dynamic_bsz`` with 64k-token
micro-batches, CUDA graphs (``enforce_eager=false``), its default engine sleep during training,
``trainer.use_v1`` (its default); checkpointing as ours) but SDPA over padded micro-batches in place of
the guide's flash-attn with ``use_remove_padding`` (no flash-attn wheel for the device: ``commands.VERL_ATTENTION``);
TRL's GRPO documentation (vLLM colocated; ``gradient_checkpointing`` as ours, which is TRL's default at
1.5B). The same vLLM share of the GPU for the three (``gpu_memory_utilization``), so that peak GPU memory
compares.

Where a response ends: in all three at Search-R1's stop strings (``</search>``, ``</answer>``, kept), the EOS
or the length limit (TRL: its ``generation_kwargs``; veRL: ``verl_search.SearchR1SingleTurnAgentLoop``, its
single-turn loop with the stop strings, as its rollout config has none). The random 1.5B policy writes no
tags: there every response is 500 tokens in all three. Multi-turn (``search``), both stop at the tags; veRL
frames an observation as a chat-template ``tool`` turn, cuts it in characters (``CHARS_PER_TOKEN``) and
ends a row at a turn without a search, where ours appends ``<information>`` inline, cuts in tokens and
answers an invalid turn with Search-R1's corrective message (docs/benchmarks.md lists them).

Figures per system and configuration (medians over the steps after ``--warmup``, >= 3 needed):
step time and its split (``gen``, ``log_prob`` = old + reference log-probs (+ reward for TRL),
``update``, ``weight_sync``), generated tokens/s (over ``gen``; response tokens, observations included),
whole-step tokens/s/GPU (prompt + response tokens over the step), searches a row (multi-turn), peak GPU
memory of the whole device (``nvidia-smi``, sampled every second, with each process's share at that peak;
the system's own torch allocator peaks beside it, allocated and reserved), a host-speed probe before each
run. Top level: ``ratio_step_vs_verl`` and ``ratio_step_vs_trl`` (their step / ours, by configuration;
goal >= 1.2 and >= 2), ``ratio_memory_vs_verl`` / ``_vs_trl`` (our peak / theirs; goal <= 1) and
``ratio_generated_vs_verl`` / ``_vs_trl`` (our generated tokens a step / theirs: far from 1, the step ratio
compares unequal work). Saved to ``<out_dir>/vs_peers_gpu.json`` after every run, so a run cut by the hold
keeps what finished. ``--ours_variant LABEL=OVERRIDE[;OVERRIDE...]`` also runs ours with those overrides
(system ``ours-LABEL``, right after ours); ``variants`` in the report compares it with ours and the peers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))  # commands.py: how each system is launched

from commands import (BenchConfig, Inputs, RETRIEVER_TOPK, VERL_AGENT_LOOP, VERL_TOOL, child_env,  # noqa: E402
                      ours_command, trl_command, verl_command)
from common import GpuMemorySampler, save_report  # noqa: E402
from gpu_generation import host_probe_ms  # noqa: E402

SYSTEMS = ("ours", "verl", "trl")
PEERS = SYSTEMS[1:]
RECORD_KEYS = ("step_s", "gen_s", "log_prob_s", "update_s", "weight_sync_s", "generated_tokens", "total_tokens",
               "memory_gib", "memory_reserved_gib", "searches")

CONFIGS = {
    "learning": BenchConfig("warm_start", None, 64, 8, 320, 320, 2e-5, 0.3, False, 65536, 64),
    "qwen1.5b": BenchConfig("qwen2.5-1.5b", ("nq", "hotpotqa"), 512, 5, 512, 500, 1e-6, 0.4, True, 65536, 32),
    # the learning recipe's rollout (verl/trainer/config/recipe/learning_gpu_rollout.yaml): 2 searches, 384-token
    # observations; a row's response is 3 x 320 + 2 x 384 = 1,728 tokens at most
    "search": BenchConfig("warm_start", None, 64, 8, 320, 320, 2e-5, 0.3, False, 65536, 64, max_turns=2,
                          max_obs_length=384),
}
# seconds one run may take unless --run_timeout_s says otherwise: start-up, step 1's compile and the steps
# (qwen1.5b on the H200: ours' step 1 took 258 s, its later steps ~150 s estimated)
RUN_TIMEOUT_S = {"learning": 480.0, "qwen1.5b": 1200.0, "search": 600.0}
# (configuration, system) pairs that cannot run, with the reason (the JSON keeps it in place of the run)
UNSUPPORTED = {
    ("search", "trl"): (
        "TRL 1.16's GRPOTrainer rolls out tool calls only in the chat template's function-calling format "
        "(tools= / environment_factory, max_tool_calling_iterations) and refuses a template that cannot render "
        "tool calls, as the SmolLM2 warm start's cannot (trl.chat_template_utils.supports_tool_calling is "
        "False); Search-R1's <search> tags would need a hand-written rollout_func (experimental), i.e. our "
        "own loop, not TRL's"),
}


# ---- per-step records, one reader per system -------------------------------------------------------
def _timing_record(r: dict, cfg: BenchConfig, weight_sync_key: str, memory_prefix: str,
                   searches: float | None = None) -> dict:
    """One step's record from a veRL-style flat metrics row (``timing_s/*``, ``response_length/mean``,
    ``perf/total_num_tokens``: both trainers name them alike, the weight sync, memory and searches apart).
    Memory: the torch allocator's peaks, allocated and reserved (GiB; the largest over the row's keys that
    start with ``memory_prefix`` + ``max_memory_allocated_gb`` / ``max_memory_reserved_gb``): the reserved
    peak less the allocated one is what the caching allocator held unused."""
    return {"step_s": r["timing_s/step"], "gen_s": r.get("timing_s/gen", 0.0),
            "log_prob_s": r.get("timing_s/old_log_prob", 0.0) + r.get("timing_s/ref", 0.0),
            "update_s": r.get("timing_s/update_actor", 0.0), "weight_sync_s": r.get(weight_sync_key, 0.0),
            "generated_tokens": r.get("response_length/mean", 0.0) * cfg.prompts * cfg.n,
            "total_tokens": r.get("perf/total_num_tokens", 0.0),
            "memory_gib": _largest(r, memory_prefix + "max_memory_allocated_gb"),
            "memory_reserved_gib": _largest(r, memory_prefix + "max_memory_reserved_gb"),
            "searches": searches if cfg.max_turns else None}


def _largest(row: dict, prefix: str) -> float | None:
    return max((v for k, v in row.items() if k.startswith(prefix)), default=None)


def _step_rows(path: Path, unwrap) -> list[dict]:
    if not path.exists():
        return []
    rows = [unwrap(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "timing_s/step" in r]


def ours_records(path: Path, cfg: BenchConfig) -> list[dict]:
    """Our ``metrics.jsonl`` (one flat row per step, ``timing_s/*``: verl/trainer/ppo/metric_utils.py;
    searches a row: ``env/number_of_valid_search``)."""
    return [_timing_record(r, cfg, "timing_s/weight_sync", "perf/", r.get("env/number_of_valid_search"))
            for r in _step_rows(path, lambda row: row)]


def verl_records(path: Path, cfg: BenchConfig) -> list[dict]:
    """veRL's FileLogger lines ``{"step": N, "data": {...}}`` (verl/utils/tracking.py ``FileLogger.log``);
    keys from verl/trainer/ppo/metric_utils.py (``timing_s/*``, ``perf/total_num_tokens``,
    ``response_length/mean``) and verl/workers/engine_workers.py (``perf/max_memory_allocated_gb`` of the
    update, prefixed ``actor/`` by the trainer's ``rename_dict``). Searches a row from ``num_turns/mean``
    (the tool agent loop counts ``user + assistant + 1`` turns, a search adding one of each to the answer's 2)."""
    return [_timing_record(r, cfg, "timing_s/update_weights", "actor/perf/",
                           (r["num_turns/mean"] - 2) / 2 if "num_turns/mean" in r else None)
            for r in _step_rows(path, lambda row: row["data"])]


def trl_records(path: Path, cfg: BenchConfig) -> list[dict]:
    """``benchmarks/peers/trl_gpu_run.py``'s ``{"steps": [...]}``."""
    if not path.exists():
        return []
    return [{**{k: s.get(k) for k in RECORD_KEYS}, "memory_gib": s.get("max_memory_allocated_gib"),
             "memory_reserved_gib": s.get("max_memory_reserved_gib")}
            for s in json.loads(path.read_text())["steps"]]


RECORDS = {"ours": ("logs/metrics.jsonl", ours_records), "verl": ("verl_metrics.jsonl", verl_records),
           "trl": ("trl_steps.json", trl_records)}


def summarise(steps: list[dict], warmup: int) -> dict:
    """Medians over the steps after the first ``warmup``; generated tokens/s over generation time and
    whole-step tokens/s/GPU (prompt + response tokens over the step; one GPU)."""
    measured = steps[warmup:]
    if not measured:
        return {"steps_measured": 0}
    median = {k: statistics.median(s[k] for s in measured) for k in RECORD_KEYS
              if all(s.get(k) is not None for s in measured)}
    generation = [s["generated_tokens"] / s["gen_s"] for s in measured if s.get("gen_s")]
    return {"steps_measured": len(measured), "enough_steps": len(measured) >= 3, "median": median,
            "generated_tokens_per_s": statistics.median(generation) if generation else None,
            "step_tokens_per_s_per_gpu": statistics.median(s["total_tokens"] / s["step_s"] for s in measured)}


# the top-level ratios: name -> (figure, ours over the peer's?). Step time: the peer's over ours; memory and
# the tokens generated a step (median; the work that varies with the policy): ours over the peer's, so that
# a step ratio read beside a `generated` ratio far from 1 is seen to compare unequal work
RATIOS = {"step": ("step_s", False), "memory": ("peak_gpu_memory_gib", True),
          "generated": ("generated_tokens", True)}


def ratio_block(results: dict, peers: tuple[str, ...] = PEERS) -> dict:
    """``ratio_<kind>_vs_<peer>`` for every kind of :data:`RATIOS` and every peer, by configuration."""
    return {f"ratio_{kind}_vs_{peer}": ratios(results, peer, key, ours_over_peer)
            for kind, (key, ours_over_peer) in RATIOS.items() for peer in peers}


def ratios(results: dict, peer: str, key: str, ours_over_peer: bool) -> dict:
    """By configuration: the peer's figure over ours (step time), or ours over the peer's (memory, work)."""
    out = {}
    for name, systems in results.items():
        figure = ratio(systems.get("ours", {}), systems.get(peer, {}), key, ours_over_peer)
        if figure is not None:
            out[name] = figure
    return out


def ratio(ours: dict, theirs: dict, key: str, ours_over_peer: bool) -> float | None:
    """One ratio of two runs' ``key`` (see :func:`ratios`); None when either lacks it or measured too few
    steps (``enough_steps``): a run cut before its steps has a memory peak of start-up alone."""
    a, b = value_of(ours, key), value_of(theirs, key)
    if not (a and b and ours.get("enough_steps") and theirs.get("enough_steps")):
        return None
    return round(a / b if ours_over_peer else b / a, 3)


def value_of(result: dict, key: str) -> float | None:
    """A run's figure: a per-step median (``step_s``, ``generated_tokens``) or a run-wide one (peak memory)."""
    median = result.get("median", {})
    return median.get(key) if key in median else result.get(key)


# ---- running ------------------------------------------------------------------------------------------
def run_child(cmd: list[str], env: dict, cwd: Path, log_path: Path, deadline: float) -> int | None:
    """Run ``cmd`` in its own process group until it exits or ``deadline`` (time.time()); then SIGKILL the
    group. Returns the exit code (None when stopped)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, process_group=0, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None and time.time() < deadline:
            time.sleep(2.0)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
    return proc.returncode


def stop_ray(env: dict) -> None:
    """``ray stop --force``: a Ray cluster a run left (its raylet is outside the run's process group)."""
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], env=env,
                   capture_output=True, timeout=60)


def run_system(system: str, name: str, cfg: BenchConfig, inputs: Inputs, args, deadline: float,
               verl_trainer: str = "v1") -> dict:
    """One system's run of a configuration: command, exit, wall time, host probe, peak GPU memory, steps."""
    work = Path(args.work_dir) / f"{name}_{system}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cmd, env, cwd = launch(system, name, cfg, inputs, args, work, verl_trainer)
    probe, before, started = host_probe_ms(), GpuMemorySampler.used_gib(), time.time()
    print(f"+ [{name}/{system}] {' '.join(cmd)}", flush=True)
    with GpuMemorySampler() as gpu:
        returncode = run_child(cmd, env, cwd, work / "run.log",
                               min(deadline, started + (args.run_timeout_s or RUN_TIMEOUT_S[name])))
    if base_system(system) != "trl":
        stop_ray(env)
    relative, reader = RECORDS[base_system(system)]
    steps = reader(work / relative, cfg)
    result = {"command": cmd, "returncode": returncode, "wall_s": round(time.time() - started, 1),
              "host_probe_ms": round(probe, 1), "gpu_memory_before_gib": round(before, 2),
              "peak_gpu_memory_gib": round(gpu.peak_gib, 2), "peak_gpu_memory_by_process_gib": gpu.by_process,
              "steps": steps, **summarise(steps, args.warmup)}
    if system == "verl":
        result["verl_trainer"] = verl_trainer
    if system in args.ours_variants:
        result["overrides"] = args.ours_variants[system]
    if returncode != 0:
        result["log_tail"] = (work / "run.log").read_text(errors="replace").splitlines()[-40:]
    return result


def launch(system: str, name: str, cfg: BenchConfig, inputs: Inputs, args, work: Path,
           verl_trainer: str = "v1") -> tuple[list[str], dict, Path]:
    """A run's command line, environment and folder: a variant of ours (``ours-LABEL``) is ours with its
    overrides last (Hydra's last value wins). Ours runs from the repo root (its scripts' relative paths),
    the peers from ``work``, outside it (our ``verl/`` would shadow veRL)."""
    base = base_system(system)
    if base == "verl":
        cmd = verl_command(cfg, inputs, args.steps, work, name, verl_trainer)
    else:
        cmd = {"ours": ours_command, "trl": trl_command}[base](cfg, inputs, args.steps, work, name)
        cmd += args.ours_variants.get(system, [])
    return cmd, child_env(base, work), ROOT if base == "ours" else work


def out_of_memory(result: dict) -> bool:
    """Whether a failed run's log tail reports a CUDA out-of-memory error."""
    return any("OutOfMemoryError" in line or "CUDA out of memory" in line for line in result.get("log_tail", []))


def run_verl(name: str, cfg: BenchConfig, inputs: Inputs, args, deadline: float, trainers: list[str]) -> dict:
    """veRL with its default v1 trainer, at ``--verl_max_token_len`` tokens a micro-batch if given, else the
    configuration's. A run that ran out of GPU memory is repeated once, with the same trainer, at half that
    budget: veRL pads its micro-batches (``commands.VERL_ATTENTION``), so the same budget of real tokens
    takes more memory there than in ours. A v1 run that logs no step for another reason (e.g. TransferQueue
    fails on the device) is repeated once with the legacy v0 trainer, which later configurations then use
    (``trainers``). ``verl_max_token_len`` in the result: the budget of the run kept, where it is not the
    configuration's."""
    def time_left() -> bool:
        return deadline - time.time() > args.min_run_s

    def attempt(trainer: str, budget: int, **previous) -> dict:
        run_cfg = replace(cfg, max_token_len=budget)
        kept = {} if budget == cfg.max_token_len else {"verl_max_token_len": budget}
        return {**run_system("verl", name, run_cfg, inputs, args, deadline, trainer), **kept, **previous}

    budget = args.verl_max_token_len or cfg.max_token_len
    result = attempt(trainers[0], budget)
    if not result["steps"] and out_of_memory(result) and time_left():
        budget //= 2
        result = attempt(trainers[0], budget, out_of_memory_attempt=result)
    if not result["steps"] and not out_of_memory(result) and trainers == ["v1", "v0"] and time_left():
        trainers.pop(0)
        result = attempt("v0", budget, v1_attempt=result)
    return result


# ---- inputs -------------------------------------------------------------------------------------------
def prepare_inputs(name: str, cfg: BenchConfig, args, retriever_url: str | None = None) -> Inputs:
    """The configuration's policy (the random shape saved once) and data: ``train.parquet`` (also the
    validation file) of the learning data's train split, filtered to ``cfg.sources``, and the same rows as
    TRL's conversational JSONL ``{prompt, target}``; multi-turn, also veRL's ``verl_train.parquet``
    (:func:`verl_search_row`) and the retriever's URL."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(Path(args.data) / "train.parquet").to_pylist()
    if cfg.sources:
        rows = [r for r in rows if r["data_source"] in cfg.sources]
    data_dir = Path(args.work_dir) / f"data_{name}"
    data_dir.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, data_dir / "train.parquet")
    pq.write_table(table, data_dir / "test.parquet")
    if cfg.max_turns:
        pq.write_table(pa.Table.from_pylist([verl_search_row(r) for r in rows]), data_dir / "verl_train.parquet")
    questions = data_dir / "trl_questions.jsonl"
    questions.write_text("".join(json.dumps({"prompt": r["prompt"], "target": list(r["reward_model"]["ground_truth"]["target"])})
                                 + "\n" for r in rows))
    return Inputs(model_path(cfg, args), data_dir, questions, retriever_url if cfg.max_turns else None)


def verl_search_row(row: dict) -> dict:
    """A learning-data row as veRL's Search-R1-like preprocessing writes one
    (``examples/data_preprocess/preprocess_search_r1_dataset.py``): the tool agent loop in ``agent_name``;
    ``extra_info`` with ``need_tools_kwargs``, the question and the search tool's ``create_kwargs``
    (ground truth, question, data source). Prompt, data source and reward model stay as they are."""
    from search_r1.envs.search_r1.prompts import question_of

    question = question_of(row["prompt"][-1]["content"])
    create = {"ground_truth": row["reward_model"]["ground_truth"], "question": question,
              "data_source": row["data_source"]}
    extra = {**(row.get("extra_info") or {}), "need_tools_kwargs": True, "question": question,
             "tools_kwargs": {VERL_TOOL: {"create_kwargs": create}}}
    return {**row, "agent_name": VERL_AGENT_LOOP, "extra_info": extra}


@contextmanager
def search_server(args):
    """The one retriever server of the multi-turn configurations, as ``benchmarks/learning_run.py`` starts
    it (BM25 over ``<data>/corpus.jsonl``, top-3, index built once under ``<work_dir>/indexes``): yields its
    ``/retrieve`` URL, or None when no configuration asked for searches by a system that searches."""
    searching = any(CONFIGS[c].max_turns and any((c, s) not in UNSUPPORTED for s in args.systems) for c in args.configs)
    if not searching:
        yield None
        return
    import learning_run

    with learning_run.start_retriever(argparse.Namespace(retriever="bm25", profile="gpu"), Path(args.data),
                                      Path(args.work_dir)) as server:
        print(f"vs_peers: retriever server at {server.retrieve_url}", flush=True)
        yield server.retrieve_url


def model_path(cfg: BenchConfig, args) -> str:
    """The warm start, or the random shape saved under ``--work_dir`` (once; the warm start's tokenizer)."""
    if cfg.model == "warm_start":
        return args.warm_start
    out = Path(args.work_dir) / cfg.model
    if not (out / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "save_random_model.py"), "--shape", cfg.model,
                        "--tokenizer", args.warm_start, "--out", str(out)], check=True, env=child_env("ours", out))
    return str(out)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="learning,qwen1.5b", help=f"comma-separated of {sorted(CONFIGS)}, run in order")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated of ours, verl, trl, run in order")
    parser.add_argument("--steps", type=int, default=5, help="steps a run (the first --warmup are not measured)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--data", default=str(ROOT / "data" / "learning"), help="a benchmarks/learning_data.py output")
    parser.add_argument("--warm_start", required=True, help="HF folder of scripts/warm_start.py's model")
    parser.add_argument("--work_dir", default="/tmp/vs_peers")
    parser.add_argument("--out_dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--budget_s", type=float, default=1200.0, help="seconds for all runs; a run is cut at the end")
    parser.add_argument("--run_timeout_s", type=float, default=None,
                        help=f"seconds a run at most (default: the configuration's, {RUN_TIMEOUT_S})")
    parser.add_argument("--min_run_s", type=float, default=150.0, help="start no run with less of the budget left")
    parser.add_argument("--verl_trainer", choices=("v1", "v0"), default=None,
                        help="only this veRL trainer (default: v1, falling back to v0 when v1 logs no step for a "
                             "reason other than GPU memory)")
    parser.add_argument("--verl_max_token_len", type=int, default=None,
                        help="veRL's micro-batch token budget from its first run (default: the configuration's; "
                             "halved once when a run runs out of GPU memory)")
    parser.add_argument("--ours_variant", action="append", default=[], metavar="LABEL=OVERRIDE[;OVERRIDE...]",
                        help="also run ours with these Hydra overrides added, right after ours, as system "
                             "ours-LABEL (repeatable); the report compares it with ours and the peers")
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = [c for c in args.configs if c not in CONFIGS] + [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown configurations or systems {unknown}; known: {sorted(CONFIGS)}, {list(SYSTEMS)}")
    try:
        args.ours_variants = dict(parse_variant(spec) for spec in args.ours_variant)
    except ValueError as err:
        parser.error(str(err))
    if args.verl_max_token_len is not None and args.verl_max_token_len <= 0:
        parser.error(f"--verl_max_token_len must be > 0 tokens, got {args.verl_max_token_len}")
    if args.ours_variants and "ours" not in args.systems:
        parser.error("--ours_variant runs beside ours: add ours to --systems")
    at = args.systems.index("ours") + 1 if args.ours_variants else 0
    args.systems[at:at] = list(args.ours_variants)
    return args


VARIANT_LABEL = re.compile(r"^[a-z0-9_]+$")


def parse_variant(spec: str) -> tuple[str, list[str]]:
    """``LABEL=OVERRIDE[;OVERRIDE...]`` -> (``ours-LABEL``, overrides).

    Raises:
        ValueError: naming the spec, when the label is not ``[a-z0-9_]+`` or an override is not ``key=value``.
    """
    label, _, rest = spec.partition("=")
    overrides = [o.strip() for o in rest.split(";") if o.strip()]
    if not VARIANT_LABEL.match(label) or not overrides or any("=" not in o for o in overrides):
        raise ValueError(f"--ours_variant {spec!r}: expected LABEL=KEY=VALUE[;KEY=VALUE...], LABEL of [a-z0-9_]")
    return f"ours-{label}", overrides


def base_system(system: str) -> str:
    """``ours`` for ``ours`` and its variants (``ours-LABEL``), else the system itself."""
    return "ours" if system.startswith("ours-") else system


def skipped(name: str, system: str, deadline: float, args) -> dict | None:
    """Why a run is not started (a configuration the system cannot run, or too little budget left), or None."""
    if (name, system) in UNSUPPORTED:
        return {"skipped": UNSUPPORTED[name, system], "unsupported": True}
    if deadline - time.time() < args.min_run_s:
        return {"skipped": f"under {args.min_run_s:.0f} s of the budget left"}
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    deadline = time.time() + args.budget_s
    state = Path(args.work_dir) / "vs_peers_gpu.json"
    results = json.loads(state.read_text())["results"] if state.exists() else {}
    verl_trainers = [args.verl_trainer] if args.verl_trainer else ["v1", "v0"]
    with search_server(args) as url:
        for name in args.configs:
            cfg, inputs = CONFIGS[name], prepare_inputs(name, CONFIGS[name], args, url)
            for system in args.systems:
                result = skipped(name, system, deadline, args)
                if result is None and system == "verl":
                    result = run_verl(name, cfg, inputs, args, deadline, verl_trainers)
                elif result is None:
                    result = run_system(system, name, cfg, inputs, args, deadline)
                results.setdefault(name, {})[system] = result
                state.write_text(json.dumps({"results": results}) + "\n")
                save_report("vs_peers_gpu", report(results, args), args.out_dir, quiet=True)
    save_report("vs_peers_gpu", report(results, args), args.out_dir, quiet=True)
    print("vs_peers: done", json.dumps({k: v for k, v in report(results, args).items() if k.startswith("ratio_")}),
          flush=True)
    return 0


def report(results: dict, args) -> dict:
    """The JSON's body: ratios first, the configurations, the runs."""
    return {**ratio_block(results), "ratio_absent": absent_ratios(results), "variants": variant_ratios(results),
            "goal": "ratio_step_vs_verl >= 1.2 and ratio_step_vs_trl >= 2 on every configuration, ratio_memory_* <= 1",
            "configs": {name: config_record(CONFIGS[name], args) for name in results},
            "steps_per_run": args.steps, "warmup_steps": args.warmup, "results": results}


def variant_ratios(results: dict) -> dict:
    """By variant of ours (``ours-LABEL``) and configuration: its overrides and, against plain ours and
    each peer run beside it, the step ratio (the other's step / the variant's) and the memory ratio (the
    variant's peak / the other's), as the top-level ratios compare ours. A variant that measured too few
    steps (cut or skipped by the budget) is left out."""
    out: dict = {}
    for name, systems in results.items():
        for variant in (s for s in systems if s.startswith("ours-") and systems[s].get("enough_steps")):
            entry = {"overrides": systems[variant].get("overrides", [])}
            for other in ("ours", *PEERS):
                for kind in ("step", "memory"):
                    figure = ratio(systems[variant], systems.get(other, {}), *RATIOS[kind])
                    if figure is not None:
                        entry[f"{kind}_vs_{other}"] = figure
            out.setdefault(variant, {})[name] = entry
    return out


def config_record(cfg: BenchConfig, args) -> dict:
    """A configuration as the JSON states it; multi-turn, with the row's budgets and the retriever."""
    if not cfg.max_turns:
        return asdict(cfg)
    return {**asdict(cfg), "response_width": cfg.response_width, "obs_chars": cfg.obs_chars,
            "retriever": {"method": "bm25", "topk": RETRIEVER_TOPK, "corpus": str(Path(args.data) / "corpus.jsonl")}}


def absent_ratios(results: dict) -> dict:
    """``ratio_step_vs_<peer>`` -> {configuration: why there is none} for the runs a peer cannot make."""
    out: dict = {}
    for name, systems in results.items():
        for system, result in systems.items():
            if result.get("unsupported"):
                out.setdefault(f"ratio_step_vs_{system}", {})[name] = result["skipped"]
    return out


if __name__ == "__main__":
    sys.exit(main())
