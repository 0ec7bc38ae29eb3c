"""LoRA against full fine-tuning in our GRPO step (issue 8): step time and peak memory, same run.

    flock /tmp/heavy.lock python benchmarks/lora_vs_full.py [--steps 3] [--lora_rank 16]

Both arms run the configuration of ``benchmarks/vs_trl.py`` (SmolLM2-135M-Instruct fp32, 8 NQ
prompts x 4 samples, <= 128 new tokens, single turn, vLLM CPU rollout, KL loss against the reference)
in separate child processes, one after the other; only ``actor_rollout_ref.model.lora_rank`` differs.
With LoRA the reference log-probs come from the same weights with adapters disabled and vLLM gets
merged weights after each update. Reports the median of steps 2..N of each ``timing_s/*`` phase and
the peak RSS of each process tree (Ray workers and the vLLM engine included).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import run_measured, save_report  # noqa: E402
from benchmarks.vs_trl import ours_command, ours_steps, pick_questions, summarise, write_inputs  # noqa: E402


def run_arm(work: Path, data_dir: Path, steps: int, lora_rank: int) -> dict:
    """One child process of ``steps`` GRPO steps; ``lora_rank`` 0 is full fine-tuning."""
    tag = f"lora{lora_rank}" if lora_rank else "full"
    ckpt = work / tag
    lora = [f"actor_rollout_ref.model.lora_rank={lora_rank}", "actor_rollout_ref.model.lora_alpha=32"]
    # LoRA needs a larger step size than full fine-tuning to move at all (peft's usual 1e-4 range).
    lr = ["actor_rollout_ref.actor.optim.lr=1e-4"] if lora_rank else []
    run = run_measured([*ours_command(data_dir, ckpt, steps, search=False), *lora, *lr])
    if run["returncode"] != 0:
        raise RuntimeError(f"{tag} run failed, exit {run['returncode']}")
    return summarise(tag, ours_steps(ckpt), run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lora_rank", type=int, default=16)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lora_vs_full_"))
    data_dir, _ = write_inputs(pick_questions(64), work)
    full = run_arm(work, data_dir, args.steps, 0)
    lora = run_arm(work, data_dir, args.steps, args.lora_rank)
    report = {
        "config": "vs_trl.py's: SmolLM2-135M-Instruct fp32, 8 prompts x 4, <=128 new tokens, single turn, "
                  f"vLLM CPU rollout; LoRA rank {args.lora_rank}, alpha 32, all linear layers",
        "full": full, "lora": lora,
        "ratio_step_time_lora_over_full": lora["median"]["step_s"] / full["median"]["step_s"],
        "ratio_update_time_lora_over_full": lora["median"]["update_s"] / full["median"]["update_s"],
        "ratio_peak_rss_lora_over_full": lora["peak_rss_gib"] / full["peak_rss_gib"],
    }
    save_report("lora_vs_full", report)


if __name__ == "__main__":
    main()
