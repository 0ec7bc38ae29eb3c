"""How long ``param_offload`` takes to move a module between host and GPU (one process, FSDP2 world of one).

    python benchmarks/offload_moves.py --shape qwen2.5-3b --repeats 3 [--out_dir DIR]

Search-R1's scripts set ``param_offload=true`` for the actor, the reference and the critic: each phase
of a step brings its module to the GPU and sends it back (:func:`verl.utils.fsdp_utils.resident`). For
a randomly initialised Qwen2.5 shape sharded by FSDP2 (fp32 parameters, bf16 compute, as the actor is;
``--dtype bfloat16`` for the reference) this times, back to back in one process, each way of moving it:

* ``pageable``: ``module.to("cpu")`` and ``module.to(gpu)`` (the baseline: a blocking copy through
  pageable host memory);
* ``pinned``: :func:`verl.utils.fsdp_utils.offload_model` and :func:`~verl.utils.fsdp_utils.load_model`
  (the module lands in page-locked host memory, reused move after move).

``--repeats`` round trips each, alternating the two (the first round trip of each is reported
apart: it allocates the host blocks). Report ``offload_moves.json``: per method the seconds of every
``offload`` and ``load``, their medians and GB/s, and ``ratio_round_trip`` = the pageable round trip's
median over the pinned one's (> 1: pinned is faster); a host-speed probe. Without a GPU both ways are
the same host-to-host copy (a smoke test of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import save_report  # noqa: E402
from benchmarks.gpu_generation import host_probe_ms  # noqa: E402
from benchmarks.shapes import build_random_model, get_shape  # noqa: E402
from verl.utils import fsdp_utils  # noqa: E402


def _synchronized_seconds(move) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    move()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started


def _pageable(model, device):
    return (lambda: model.to("cpu"), lambda: model.to(device))


def _pinned(model, device):
    return (lambda: fsdp_utils.offload_model(model), lambda: fsdp_utils.load_model(model, device))


METHODS = {"pageable": _pageable, "pinned": _pinned}


def measure(model, device, repeats: int) -> dict:
    """Per method: ``first`` (the first round trip) and ``offload_s`` / ``load_s`` of the next
    ``repeats``, alternating methods so the machine's drift touches both alike."""
    out = {name: {"offload_s": [], "load_s": []} for name in METHODS}
    for round_trip in range(repeats + 1):
        for name, moves in METHODS.items():
            offload, load = moves(model, device)
            seconds = {"offload_s": _synchronized_seconds(offload), "load_s": _synchronized_seconds(load)}
            if round_trip == 0:
                out[name]["first"] = seconds
                continue
            for key, value in seconds.items():
                out[name][key].append(value)
    return out


def summarize(timings: dict, nbytes: int) -> dict:
    """Medians, GB/s (``nbytes`` / median seconds) and ``ratio_round_trip`` (pageable / pinned)."""
    for method in timings.values():
        for key in ("offload_s", "load_s"):
            median = statistics.median(method[key])
            method[f"median_{key}"] = median
            method[f"gb_per_s_{key.removesuffix('_s')}"] = nbytes / median / 1e9 if median > 0 else None
        method["median_round_trip_s"] = method["median_offload_s"] + method["median_load_s"]
    pinned = timings["pinned"]["median_round_trip_s"]
    return {"methods": timings,
            "ratio_round_trip": timings["pageable"]["median_round_trip_s"] / pinned if pinned > 0 else None}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen2.5-3b", help="a shape of benchmarks/shapes.py")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="the stored parameters' dtype (float32: the actor's; bfloat16: the reference's)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out_dir", default=None, help="folder of offload_moves.json (default benchmarks/results)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    device = fsdp_utils.accelerator() or torch.device("cpu")
    model = build_random_model(get_shape(args.shape), getattr(torch, args.dtype), device)
    model = fsdp_utils.apply_fsdp2(model, mixed_precision="bf16")
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    report = {"benchmark": "offload_moves", "shape": args.shape, "dtype": args.dtype, "bytes": nbytes,
              "repeats": args.repeats, "host_probe_ms": round(host_probe_ms(), 1),
              **summarize(measure(model, device, args.repeats), nbytes)}
    save_report("offload_moves", report, args.out_dir)
    return report


if __name__ == "__main__":
    main()
