"""Summarise the paper-length training runs (``paper_scale_train.sh``) into one JSON.

    python benchmarks/paper_scale_summary.py --runs_dir $OUT/paper_train --batch 64 \\
        --max_prompt_length 4096 --output $OUT/paper_scale_train.json

Per run (a ``<runs_dir>/<algo>/metrics.jsonl`` written by the trainer's jsonl logger): the steps, and
for every ``timing_s/*``, ``perf/*`` (peak GPU memory per phase, tokens/s, update MFU), length and
search metric, step 1 (compilation, CUDA graphs, first allocations) and the median of later steps;
``tokens_per_s_per_gpu`` is ``perf/throughput_tokens_per_s`` over the GPUs. Also the longest context
(prompt + response tokens) seen, to show whether multi-turn contexts above 2k tokens occurred.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import run_metadata  # noqa: E402

PREFIXES = ("timing_s/", "perf/", "response_length/", "prompt_length/", "critic/score/", "env/")


def summarize_run(path: Path, num_gpus: int) -> dict:
    """Step-1 values and medians of later steps of one run's ``metrics.jsonl``."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing_s/step" in r or any(k.startswith("timing_s/") for k in r)]
    if not rows:
        return {"steps": 0}
    keys = sorted({k for r in rows for k, v in r.items() if isinstance(v, (int, float))
                   and k.startswith(PREFIXES)})
    later = rows[1:] or rows
    out = {"steps": len(rows),
           "step_1": {k: rows[0][k] for k in keys if k in rows[0]},
           "median_after_step_1": {k: statistics.median(r[k] for r in later if k in r) for k in keys
                                   if any(k in r for r in later)}}
    tps = out["median_after_step_1"].get("perf/throughput_tokens_per_s")
    out["tokens_per_s_per_gpu"] = tps / num_gpus if tps is not None else None
    longest = [r.get("prompt_length/max", 0) + r.get("response_length/max", 0) for r in rows]
    out["longest_context_tokens"] = max(longest) if longest else None
    return out


def _describe_model(folder: str) -> str:
    bias = Path(folder) / "search_bias.json"
    if bias.exists():
        return f"{folder}: Qwen2.5-3B shape, random weights biased to search ({bias.read_text().strip()})"
    return folder


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs_dir", required=True, type=Path)
    p.add_argument("--batch", type=int, required=True, help="prompts per step (data.train_batch_size)")
    p.add_argument("--max_prompt_length", type=int, default=4096)
    p.add_argument("--num_gpus", type=int, default=1)
    p.add_argument("--model", default="/tmp/q3b-search", help="the policy folder (described in the report)")
    p.add_argument("--output", required=True, type=Path)
    args = p.parse_args(argv)
    runs = {}
    for metrics in sorted(args.runs_dir.glob("*/metrics.jsonl")):
        runs[metrics.parent.name] = {"max_prompt_length": args.max_prompt_length, "train_batch_size": args.batch,
                                     "num_gpus": args.num_gpus, "model": _describe_model(args.model),
                                     **summarize_run(metrics, args.num_gpus)}
    report = {"benchmark": "paper_scale_train", "meta": run_metadata(), "runs": runs}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
