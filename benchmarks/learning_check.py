"""Learning check (issues 6, 8): GRPO from the SmolLM2 warm start; does the curve rise?

Runs the embedded default (``scripts/quickstart.py``: example data, local BM25 retriever) for
``--steps`` GRPO steps starting from the cached warm start (``scripts/warm_start.py``), with greedy
validation every ``--test_freq`` steps, then writes per step: mean train score, validation EM,
searches per question and response length as a PNG and a markdown table, plus a JSON report with
commit, command and machine. The baseline in the same run is step 0 (validation before training);
the report gives the last/first ratios.

    python benchmarks/learning_check.py --steps 20 --out_dir benchmarks/results/learning_check
    python benchmarks/learning_check.py --gpu --batch_size 64 --n 8 --steps 30 --out_dir $OUT/lc   # one GPU
    python benchmarks/learning_check.py --env tool_call --steps 4 --out_dir benchmarks/results/learning_check_tool_call
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from verl.trainer.overrides import recipe_overrides  # noqa: E402

COLUMNS = {  # metric key -> column title
    "critic/score/mean": "train score",
    "reward_extra/em": "train EM",
    "val/test_score/all": "val score (greedy)",
    "val/test_em/all": "val EM (greedy)",
    "env/number_of_valid_search": "searches / question",
    "response_length/mean": "response tokens",
}


# Search-R1's format-reward variant (verl/trainer/config/recipe/format_reward.yaml, as key=value
# overrides so that a baseline checkout older than recipes takes them too).
FORMAT_REWARD = recipe_overrides("format_reward")


def grpo_overrides(model_path: str, steps: int, test_freq: int, out_dir: Path, lr: float,
                   batch_size: int = 8, rollout: str = "vllm", format_reward: bool = True, n: int = 4,
                   gpu: bool = False, env: str = "search_r1") -> list[str]:
    """GRPO recipe: ``batch_size`` prompts x ``n`` samples per step, 2 search turns, greedy validation,
    in environment ``env`` (the format reward is Search-R1's)."""
    return (FORMAT_REWARD if format_reward else []) + (GPU_ARGS if gpu else CPU_ARGS) + [f"env.name={env}",
        f"actor_rollout_ref.model.path={model_path}", "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "trainer.n_gpus_per_node=1", f"actor_rollout_ref.rollout.name={rollout}", f"actor_rollout_ref.rollout.n={n}",
        f"data.train_batch_size={batch_size}", "data.val_batch_size=30", "data.val_data_num=30",
        "data.max_prompt_length=1536", "data.max_start_length=320", "data.max_response_length=384",
        "data.max_obs_length=224", "max_turns=2", f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_size}",
        f"actor_rollout_ref.actor.optim.lr={lr}", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
        f"trainer.total_training_steps={steps}", f"trainer.test_freq={test_freq}", f"trainer.save_freq={test_freq}",
        "trainer.val_before_train=true", "trainer.logger=[console,jsonl]", f"trainer.log_dir={out_dir}",
        f"trainer.default_local_dir={ckpt_dir()}", "trainer.experiment_name=learning_check",
        "trainer.resume_mode=auto", "trainer.max_actor_ckpt_to_keep=1",  # main() clears it unless --resume
    ]


# 2 CPU cores: fp32 everywhere (no bf16 matmuls), no offload, no recompute, short packed rows.
CPU_ARGS = [
    "actor_rollout_ref.actor.ppo_micro_batch_size=8", "actor_rollout_ref.rollout.log_prob_micro_batch_size=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size=8",
    "actor_rollout_ref.model.enable_gradient_checkpointing=false", "actor_rollout_ref.model.max_packed_row_len=1024",
    "actor_rollout_ref.actor.fsdp_config.param_offload=false",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false", "actor_rollout_ref.ref.fsdp_config.param_offload=false",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32", "actor_rollout_ref.rollout.dtype=float32",
]
# One GPU: bf16, token-budget micro-batches, a small slice of memory for vLLM's KV cache (plenty for 135M).
GPU_ARGS = [
    "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
    "actor_rollout_ref.actor.ppo_micro_batch_size=64", "actor_rollout_ref.rollout.log_prob_micro_batch_size=64",
    "actor_rollout_ref.ref.log_prob_micro_batch_size=64", "actor_rollout_ref.rollout.gpu_memory_utilization=0.1",
    "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    "actor_rollout_ref.actor.fsdp_config.param_offload=false",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false", "actor_rollout_ref.ref.fsdp_config.param_offload=false",
]


def ckpt_dir() -> Path:
    """Checkpoints (GBs) go to the cache, never next to the committed results."""
    from verl.utils.model_zoo import cache_root

    return cache_root() / "learning_check_ckpt"


def read_metrics(path: Path) -> list[dict]:
    """Metric rows by step; a step logged again after a resume replaces the earlier row."""
    by_step: dict[int, dict] = {}
    with open(path) as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                by_step[row["step"]] = row
    return [by_step[step] for step in sorted(by_step)]


def table(rows: list[dict]) -> str:
    """Markdown table, one line per step that has any of the tracked metrics."""
    lines = ["| step | " + " | ".join(COLUMNS.values()) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for row in rows:
        if not any(k in row for k in COLUMNS):
            continue
        cells = [f"{row[k]:.3f}" if k in row else "" for k in COLUMNS]
        lines.append(f"| {row['step']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(COLUMNS), figsize=(4 * len(COLUMNS), 3.2))
    for ax, (key, title) in zip(axes, COLUMNS.items()):
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points), marker="o")
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def summary(rows: list[dict]) -> dict:
    """First/last values and ratios of each tracked metric."""
    out = {}
    for key, title in COLUMNS.items():
        values = [r[key] for r in rows if key in r]
        if values:
            first, last = values[0], values[-1]
            out[title] = {"first": first, "last": last, "ratio": (last / first) if first else None,
                          "points": len(values)}
    return out


def machine() -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(), "gpu": gpu}


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--test_freq", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--batch_size", type=int, default=8, help="prompts per step (x n samples)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (GRPO group size)")
    parser.add_argument("--gpu", action="store_true", help="one-GPU recipe (bf16, dynamic batch sizes)")
    parser.add_argument("--rollout", default="vllm", help="vllm | hf")
    parser.add_argument("--em_only", action="store_true", help="plain EM reward (no format/retrieval terms)")
    parser.add_argument("--env", default="search_r1", help="environment (env.name): search_r1 | tool_call (EM only)")
    parser.add_argument("--train_sources", default="hotpotqa",
                        help="example/qa sources to train on; the example corpus holds the gold paragraphs "
                             "of HotpotQA train questions but no passages for the NQ-train (AmbigQA) ones")
    parser.add_argument("--test_sources", default="hotpotqa")
    parser.add_argument("--model", default=None, help="default: the cached SmolLM2 warm start")
    parser.add_argument("--out_dir", default=str(ROOT / "benchmarks" / "results" / "learning_check"))
    parser.add_argument("--report_only", action="store_true", help="re-plot an existing metrics.jsonl")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run from its last checkpoint (saved every --test_freq steps)")
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    command = []
    if not args.report_only:
        from warm_start import ensure_warm_start

        model = args.model or ensure_warm_start()
        if not args.resume:  # a fresh run from the warm start
            (out_dir / "metrics.jsonl").unlink(missing_ok=True)
            shutil.rmtree(ckpt_dir(), ignore_errors=True)
        data = ["--data-dir", f"data/learning_check_{args.train_sources}_{args.test_sources}".replace(",", "-"),
                "--train-sources", args.train_sources, "--test-sources", args.test_sources]
        command = [sys.executable, str(ROOT / "scripts" / "quickstart.py"), *data,
                   *grpo_overrides(model, args.steps, args.test_freq, out_dir, args.lr, args.batch_size,
                                   args.rollout, format_reward=not args.em_only and args.env == "search_r1", n=args.n,
                                   gpu=args.gpu, env=args.env)]
        print("+ " + shlex.join(command), flush=True)
        started = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True)
        print(f"GRPO run: {time.perf_counter() - started:.0f} s")
    rows = read_metrics(out_dir / "metrics.jsonl")
    plot(rows, out_dir / "learning_check.png")
    report = {"commit": commit(), "command": shlex.join(command), "machine": machine(),
              "summary": summary(rows), "table": table(rows)}
    (out_dir / "learning_check.json").write_text(json.dumps(report, indent=1))
    print(report["table"])
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
