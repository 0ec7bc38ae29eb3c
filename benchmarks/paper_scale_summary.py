"""Summarise the paper-length training runs (``paper_scale_train.sh``) into one JSON.

    python benchmarks/paper_scale_summary.py --runs_dir $OUT/paper_train/qwen2.5-3b --shape qwen2.5-3b \\
        --batch 64 --max_prompt_length 4096 --output $OUT/paper_scale_train_qwen2.5-3b.json \\
        --into $OUT/paper_scale.json

Per run (a ``<runs_dir>/<algo>/metrics.jsonl`` written by the trainer's jsonl logger): the steps, and
for every ``timing_s/*``, ``perf/*`` (peak GPU memory per phase, tokens/s, update MFU), length and
search metric, step 1 (compilation, CUDA graphs, first allocations) and the median of later steps;
``tokens_per_s_per_gpu`` is ``perf/throughput_tokens_per_s`` over the GPUs. Also the longest context
(prompt + response tokens of one row) seen, to show whether multi-turn contexts above 2k tokens occurred,
and ``figures``: what issue 28 asks of each run (step time and split, tokens/s/GPU, the update's MFU,
peak GPU memory: the trainer's torch reserved peak and, where ``gpu_peak.json`` was recorded, the whole
GPU's, longest context). ``--into`` adds the runs to another report under ``train``, keyed
``<shape>_<run>`` (``<shape>_<run>_<n>gpu`` for runs on ``--num_gpus`` n > 1; a later run of the same key
replaces it), and rewrites its ``scaling``: each multi-GPU run against the 1-GPU run of the same key.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import run_metadata  # noqa: E402
from benchmarks.gpu_generation import host_probe_ms  # noqa: E402

PREFIXES = ("timing_s/", "perf/", "response_length/", "prompt_length/", "context_length/", "critic/score/", "env/")
SPLIT = ("gen", "ref", "old_log_prob", "values", "update_critic", "update_actor", "weight_sync")
"""the step's phases in ``figures.split_s``"""


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
    median = out["median_after_step_1"]
    tps = median.get("perf/throughput_tokens_per_s")
    out["tokens_per_s_per_gpu"] = tps / num_gpus if tps is not None else None
    # the trainer's context_length/max (a row's prompt + response); older runs' logs lack it, and the
    # longest prompt plus the longest response is only a bound on it
    exact = [r["context_length/max"] for r in rows if "context_length/max" in r]
    out["longest_context_tokens"] = max(exact) if exact else None
    if not exact:
        out["longest_context_bound_tokens"] = max(r.get("prompt_length/max", 0) + r.get("response_length/max", 0)
                                                  for r in rows)
    out["figures"] = {
        "steps_measured": len(later) if len(rows) > 1 else 0,
        "step_s": median.get("timing_s/step"),
        "split_s": {k.removeprefix("timing_s/"): v for k, v in median.items()
                    if k.startswith("timing_s/") and k.removeprefix("timing_s/") in SPLIT},
        "tokens_per_s_per_gpu": out["tokens_per_s_per_gpu"],
        "mfu_update": median.get("perf/mfu/actor"),
        "peak_gpu_gib": max((r[k] for r in rows for k in r if k.startswith("perf/max_memory_reserved_gb/")),
                            default=None),
        "longest_context_tokens": out["longest_context_tokens"],
        **whole_gpu_peak(path.parent),
    }
    return out


def whole_gpu_peak(run_dir: Path) -> dict:
    """The whole GPU's peak over the run, every process counted (``gpu_peak.json``, written beside the
    metrics by ``benchmarks/gpu_peak.py``): ``peak_gpu_whole_gib`` and each process's share at that peak.
    ``peak_gpu_gib`` above is the trainer's own torch reserved peak, which misses an engine-core process's
    memory. Empty for a run without the file (before it existed, or on a machine without nvidia-smi)."""
    recorded = run_dir / "gpu_peak.json"
    if not recorded.exists():
        return {}
    peak = json.loads(recorded.read_text())
    return {"peak_gpu_whole_gib": peak["peak_gpu_memory_gib"],
            "peak_gpu_by_process_gib": peak["peak_gpu_memory_by_process_gib"]}


def scaling(train: dict) -> dict:
    """Each run on n > 1 GPUs against the 1-GPU run of its shape and algorithm (``train``'s keys
    ``<key>_<n>gpu`` and ``<key>``), as weak scaling: the runs give each GPU the same share of the batch
    (``paper_scale_train.sh``'s ``GPUS``), so ``efficiency`` = tokens/s/GPU on n GPUs over tokens/s/GPU
    on one (1.0: perfect) and ``speedup`` = whole-step tokens/s on n GPUs over one GPU's (n: perfect).
    Pairs where either run measured no step after the first (``figures.steps_measured`` 0) are left out."""
    out = {}
    for key, run in sorted(train.items()):
        gpus = run.get("num_gpus", 1)
        one = train.get(key.removesuffix(f"_{gpus}gpu")) if gpus > 1 and key.endswith(f"_{gpus}gpu") else None
        if one is None or not (one["figures"]["steps_measured"] and run["figures"]["steps_measured"]):
            continue
        per_gpu = [one["figures"]["tokens_per_s_per_gpu"], run["figures"]["tokens_per_s_per_gpu"]]
        out[key] = {"num_gpus": [1, gpus], "train_batch_size": [one["train_batch_size"], run["train_batch_size"]],
                    "step_s": [one["figures"]["step_s"], run["figures"]["step_s"]],
                    "tokens_per_s_per_gpu": per_gpu, "efficiency": round(per_gpu[1] / per_gpu[0], 3),
                    "speedup": round(gpus * per_gpu[1] / per_gpu[0], 3)}
    return out


def _describe_model(folder: str, shape: str) -> str:
    bias = Path(folder) / "search_bias.json"
    if bias.exists():
        return f"{folder}: {shape} shape, random weights biased to search ({bias.read_text().strip()})"
    return folder


def _overrides(run_dir: Path) -> list[str] | None:
    """The Hydra overrides the run was started with (``overrides.txt``, one a line, written by
    ``paper_scale_train.sh``); None for a run without the file."""
    listed = run_dir / "overrides.txt"
    return listed.read_text().split("\n")[:-1] if listed.exists() else None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs_dir", required=True, type=Path)
    p.add_argument("--batch", type=int, required=True, help="prompts per step (data.train_batch_size)")
    p.add_argument("--max_prompt_length", type=int, default=4096)
    p.add_argument("--num_gpus", type=int, default=1)
    p.add_argument("--model", default="/tmp/qwen2.5-3b-search", help="the policy folder (described in the report)")
    p.add_argument("--shape", default="qwen2.5-3b", help="the model's shape (benchmarks/shapes.py)")
    p.add_argument("--retriever", default="bm25", help="the retriever server the runs searched (bm25 | scale)")
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--into", type=Path, default=None,
                   help="also add the runs to this report under 'train' (benchmarks/results/paper_scale.json)")
    args = p.parse_args(argv)
    runs = {}
    for metrics in sorted(args.runs_dir.glob("*/metrics.jsonl")):
        runs[metrics.parent.name] = {"model_shape": args.shape, "max_prompt_length": args.max_prompt_length,
                                     "train_batch_size": args.batch, "num_gpus": args.num_gpus,
                                     "model": _describe_model(args.model, args.shape), "retriever": args.retriever,
                                     "overrides": _overrides(metrics.parent),
                                     **summarize_run(metrics, args.num_gpus)}
    # the host's speed as the report is written (right after the run): these machines are shared
    report = {"benchmark": "paper_scale_train", "meta": {**run_metadata(), "host_probe_ms": round(host_probe_ms(), 1)},
              "runs": runs}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    if args.into:
        merged = json.loads(args.into.read_text()) if args.into.exists() else {}
        suffix = f"_{args.num_gpus}gpu" if args.num_gpus > 1 else ""
        merged.setdefault("train", {}).update({f"{args.shape}_{name}{suffix}": {**run, "meta": report["meta"]}
                                               for name, run in runs.items()})
        merged["scaling"] = scaling(merged["train"])
        args.into.write_text(json.dumps(merged, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
