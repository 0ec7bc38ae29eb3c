"""``fsdp_config.param_offload``'s moves of one module: through pageable host memory (``model.to``, the
path before the page-locked home) against :func:`verl.utils.fsdp_utils.offload_model` /
:func:`~verl.utils.fsdp_utils.load_model` (one exact-size page-locked buffer kept from move to move).

A random-init model of ``--shape`` in fp32 (the actor's master weights; ``--dtype bf16``: the
reference), sharded by FSDP2 over a world of one, makes ``--round_trips`` round trips (host -> GPU ->
host) each way, the two ways alternating so that both see the same machine; each round trip ends with
the GPU synchronized.
JSON ``offload_moves.json``: per way the round trips' seconds (median, range) and GB/s each way,
``ratio_round_trip`` (pageable median / home median; > 1: the home is faster) and a host-speed probe.
On a CPU-only machine both ways move host to host (the smoke test: same code, no GPU figures).

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/offload_moves.py --shape qwen2.5-3b --out_dir $OUT
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import save_report  # noqa: E402
from benchmarks.gpu_generation import host_probe_ms  # noqa: E402
from benchmarks.shapes import build_random_model, get_shape  # noqa: E402
from verl.utils import fsdp_utils  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def pageable_round_trip(model: torch.nn.Module, device: torch.device) -> tuple[float, float]:
    """Seconds to the device and back through ``model.to`` (fresh pageable host memory each time)."""
    start = time.perf_counter()
    model.to(device)
    _sync()
    loaded = time.perf_counter()
    model.to("cpu")
    _sync()
    return loaded - start, time.perf_counter() - loaded


def home_round_trip(model: torch.nn.Module, device: torch.device) -> tuple[float, float]:
    """Seconds to the device and back through ``load_model`` / ``offload_model`` (the kept home)."""
    start = time.perf_counter()
    fsdp_utils.load_model(model, device)
    _sync()
    loaded = time.perf_counter()
    fsdp_utils.offload_model(model)
    _sync()
    return loaded - start, time.perf_counter() - loaded


def _summary(trips: list[tuple[float, float]], nbytes: int) -> dict:
    total = [a + b for a, b in trips]

    def gb_per_s(seconds: list[float]) -> float | None:
        median = statistics.median(seconds)
        return round(nbytes / 1e9 / median, 2) if median > 0 else None

    return {"round_trip_s": [round(t, 4) for t in total],
            "round_trip_median_s": round(statistics.median(total), 4),
            "round_trip_range_s": [round(min(total), 4), round(max(total), 4)],
            "load_gb_per_s": gb_per_s([t[0] for t in trips]),
            "offload_gb_per_s": gb_per_s([t[1] for t in trips])}


def _ratio(pageable: list[tuple[float, float]], home: list[tuple[float, float]]) -> float | None:
    """Median pageable round trip / median home round trip; None where the home's took no measurable
    time (host to host on a CPU-only machine)."""
    home_s = statistics.median(a + b for a, b in home)
    return round(statistics.median(a + b for a, b in pageable) / home_s, 3) if home_s > 0 else None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-3b", help="benchmarks/shapes.py name ('tiny' on a CPU)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                        help="the module's storage dtype: fp32 (the actor's master weights) or bf16 (the reference)")
    parser.add_argument("--round_trips", type=int, default=5, help="round trips each way (the first is warm-up)")
    parser.add_argument("--out_dir", default=None, help="where offload_moves.json goes (default benchmarks/results)")
    args = parser.parse_args(argv)
    if args.round_trips < 2:
        parser.error(f"--round_trips must be >= 2 (one warm-up and one timed), got {args.round_trips}")

    device = fsdp_utils.accelerator() or torch.device("cpu")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = fsdp_utils.apply_fsdp2(build_random_model(get_shape(args.shape), dtype, "cpu"),
                                   mixed_precision="bf16")
    fsdp_utils.offload_model(model)  # the module's home from now on, as the workers do after building it
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    trips: dict[str, list] = {"pageable": [], "home": []}
    probes = []
    for _ in range(args.round_trips):
        probes.append(host_probe_ms())
        model._apply(lambda t: t.clone())  # untimed: fresh pageable tensors, as model.to("cpu") leaves them
        trips["pageable"].append(pageable_round_trip(model, device))
        fsdp_utils.offload_model(model)  # untimed: back into the kept home
        trips["home"].append(home_round_trip(model, device))
    results = {name: _summary(runs[1:], nbytes) for name, runs in trips.items()}
    home = fsdp_utils._HOST_HOMES[model]
    report = {
        "shape": args.shape, "dtype": args.dtype, "device": str(device), "param_bytes": nbytes,
        "round_trips": args.round_trips,
        "host_probe_ms": [round(p, 2) for p in probes],
        "home_page_locked": home.page_locked, "home_bytes": home.tensor.numel(),
        "by_way": results,
        "ratio_round_trip": _ratio(trips["pageable"][1:], trips["home"][1:]),
    }
    save_report("offload_moves", report, args.out_dir)
    return report


if __name__ == "__main__":
    main()
