"""Generation throughput on one GPU: vLLM (the project's rollout engine) vs transformers ``generate``.

For each model shape (Qwen2.5 architectures, **random weights**, see ``benchmarks/shapes.py``) and
each batch of prompts (default 64/256/1024 prompts of ``--prompt_len`` random token ids), every row
generates exactly ``--new_tokens`` tokens (``min_new_tokens == max_new_tokens`` for transformers,
``max_tokens`` + ``ignore_eos`` for vLLM), so both engines do the same work. Greedy
decoding by default. tokens/s = generated tokens / wall time of the whole ``generate`` call
(prefill included); for vLLM also the decode-only rate (the prefill time, measured with 1 new token
on the same prompts, subtracted), the like-for-like figure for the decode bound below.

The decode bandwidth bound is ``batch / ((weight bytes + KV bytes at the mean context) / 4.8e12)``
tokens/s (see :func:`benchmarks.shapes.decode_bound_tokens_per_s`), with the mean context
``prompt_len + new_tokens / 2``; the report gives each measurement's fraction of it.

Each configuration is time-boxed: two short warm calls (1 and 9 new tokens) project the
transformers run time (:func:`project_generate_s`) and the run is skipped (with the projection in
the JSON) when it would exceed ``--hf_config_budget_s``; a run that goes ahead records its
projection beside its measured time; the whole script stops starting new work after ``--time_budget_s``. The
JSON is rewritten after every configuration, so a run killed by an outer timeout keeps what it did.

CPU smoke test: ``python benchmarks/gpu_generation.py --shapes tiny --batches 2,4 --prompt_len 16
--new_tokens 8 --engines hf``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import save_report  # noqa: E402
from benchmarks.shapes import build_random_model, decode_bound_tokens_per_s, get_shape, qwen2_config  # noqa: E402

HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e peak bandwidth
PROBE_TOKENS = 8


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b", help="comma list from benchmarks/shapes.py")
    parser.add_argument("--batches", default="64,256,1024", help="comma list of prompt counts")
    parser.add_argument("--prompt_len", type=int, default=256)
    parser.add_argument("--new_tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--engines", default="hf,vllm", help="comma list of hf, vllm")
    parser.add_argument("--hf_config_budget_s", type=float, default=45.0,
                        help="skip a transformers config whose projected time exceeds this")
    parser.add_argument("--time_budget_s", type=float, default=330.0,
                        help="start no new configuration after this many seconds")
    parser.add_argument("--vllm_mode", default="cudagraph", choices=["cudagraph", "compiled", "eager"],
                        help="cudagraph: full decode CUDA graphs without torch.compile (fast start); "
                             "compiled: vLLM's default torch.compile + graphs; eager: enforce_eager")
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.6)
    parser.add_argument("--async_scheduling", action="store_true", help="vLLM async_scheduling=True")
    parser.add_argument("--profile_steps", type=int, default=0,
                        help="after the runs, profile this many decode steps at the largest batch (torch "
                             "profiler, CPU + CUDA; runs the engine in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    parser.add_argument("--dtype", default=None, help="bfloat16 on GPU, float32 on CPU by default")
    parser.add_argument("--out_dir", default=None, help="where the JSON goes (default benchmarks/results)")
    parser.add_argument("--name", default="gpu_generation")
    return parser.parse_args(argv)


def host_probe_ms(loops: int = 2_000_000, clock: Callable[[], int] = time.perf_counter_ns) -> float:
    """Milliseconds a fixed pure-Python loop takes now: the host CPU's single-thread speed.

    vLLM's scheduler and input preparation are Python on one core, so decode runs that differ
    this much in wall time can be checked against the host's speed at that moment.

    Args:
        loops: iterations of the loop (the default takes tens of milliseconds on a server core).
        clock: integer nanosecond clock (``time.perf_counter_ns``); the result keeps its full
            resolution (not rounded), so even a short probe reads as a positive duration.
    Returns:
        Elapsed milliseconds as a float (round it where it is reported).
    """
    start = clock()
    total = 0
    for i in range(loops):
        total += i & 7
    return (clock() - start) / 1e6


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_prompts(batch: int, prompt_len: int, vocab_size: int, seed: int = 0) -> torch.Tensor:
    """``(batch, prompt_len)`` token ids drawn uniformly below the special tokens of the vocab."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab_size - 1, 151_643), (batch, prompt_len), generator=gen)


def bound_fields(shape, batch: int, args, tokens_per_s: float) -> dict:
    bound = decode_bound_tokens_per_s(shape, batch, args.prompt_len + args.new_tokens / 2, HBM_BYTES_PER_S)
    return {"bound_tokens_per_s": round(bound["bound_tokens_per_s"], 1),
            "fraction_of_bound": float(f"{tokens_per_s / bound['bound_tokens_per_s']:.4g}")}


# ------------------------------------------------------------------ transformers generate
def _hf_generate(model, prompts: torch.Tensor, new_tokens: int, temperature: float) -> tuple[float, int]:
    """Run ``model.generate``; returns (seconds, generated tokens)."""
    input_ids = prompts.to(model.device)
    sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature,
                                                              "top_p": 1.0, "top_k": 0}
    _sync()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=True,
                             pad_token_id=model.config.pad_token_id, **sampling)
    _sync()
    seconds = time.perf_counter() - start
    generated = out.shape[1] - input_ids.shape[1]
    if generated != new_tokens:
        raise RuntimeError(f"generate returned {generated} new tokens, expected {new_tokens}")
    return seconds, prompts.shape[0] * generated


def project_generate_s(first_s: float, probe_s: float, probe_tokens: int, new_tokens: int) -> float:
    """Projected seconds of a ``new_tokens`` ``generate`` call from two short warm calls.

    ``first_s`` is a call that makes 1 new token (the prefill plus one step), ``probe_s`` one that
    makes ``1 + probe_tokens``; their difference is ``probe_tokens`` decode steps. The projection is
    ``first_s + (new_tokens - 1) * (probe_s - first_s) / probe_tokens``: the prefill counted once,
    not once per probe length as scaling a whole short call by ``new_tokens / probe_tokens`` does
    (that also scaled the first call's one-off warm-up cost, and overstated the run ~10x).
    Decode steps late in a long call attend over a longer context; for the model sizes and
    lengths measured here the weight reads dominate, so the projection is a slight underestimate.

    Args:
        first_s, probe_s: wall seconds of the two calls (after a warm-up call).
        probe_tokens: new tokens of the second call beyond the first one's.
        new_tokens: new tokens of the call to project.
    """
    per_token_s = max(probe_s - first_s, 0.0) / probe_tokens
    return first_s + (new_tokens - 1) * per_token_s


def run_hf(shape, args, dtype, device, deadline: float) -> list[dict]:
    """transformers ``generate`` (sdpa, KV cache) at every batch size; time-boxed per config."""
    model = build_random_model(shape, dtype, device, attn_implementation="sdpa").eval()
    results = []
    for batch in args.batches:
        row = {"engine": "transformers.generate", "batch": batch}
        prompts = random_prompts(batch, args.prompt_len, shape.vocab_size)
        if time.perf_counter() > deadline:
            results.append({**row, "skipped": "script time budget (--time_budget_s) exhausted"})
            continue
        try:
            _hf_generate(model, prompts, 1, args.temperature)  # warm-up: kernels, allocator, caches
            first_s, _ = _hf_generate(model, prompts, 1, args.temperature)
            probe_s, _ = _hf_generate(model, prompts, 1 + PROBE_TOKENS, args.temperature)
            projected = project_generate_s(first_s, probe_s, PROBE_TOKENS, args.new_tokens)
            if projected > args.hf_config_budget_s or time.perf_counter() + projected > deadline:
                results.append({**row, "skipped": f"projected {projected:.3g} s > budget "
                                f"(--hf_config_budget_s {args.hf_config_budget_s} or script deadline)",
                                "projected_s": projected})
                continue
            _reset_peak()
            seconds, tokens = _hf_generate(model, prompts, args.new_tokens, args.temperature)
        except torch.OutOfMemoryError as err:
            results.append({**row, "skipped": f"out of memory: {str(err)[:200]}"})
            torch.cuda.empty_cache()
            continue
        tps = tokens / seconds
        results.append({**row, "seconds": round(seconds, 3), "projected_s": round(projected, 3),
                        "generated_tokens": tokens, "tokens_per_s": round(tps, 1), "peak_mem_gib": _peak_gib(), **bound_fields(shape, batch, args, tps)})
        print(f"  hf   batch {batch:5d}: {tps:10.1f} tok/s ({seconds:.1f} s)", flush=True)
    del model
    _free()
    return results


def _reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------ vLLM
def vllm_kwargs(args, max_batch: int) -> dict:
    """Engine arguments for ``--vllm_mode`` (random 'dummy' weights, token ids in and out)."""
    kwargs = {"load_format": "dummy", "skip_tokenizer_init": True, "dtype": args.dtype_name, "seed": 0,
              "max_model_len": args.prompt_len + args.new_tokens + 16, "max_num_seqs": max_batch,
              "gpu_memory_utilization": args.gpu_memory_utilization, "enable_prefix_caching": False}
    if args.async_scheduling:  # schedule step t+1 on the CPU while the GPU runs step t
        kwargs["async_scheduling"] = True
    if args.vllm_mode == "eager" or not torch.cuda.is_available():
        kwargs["enforce_eager"] = True
    elif args.vllm_mode == "cudagraph":
        # No torch.compile (minutes per shape), but full CUDA graphs for the decode batches measured.
        kwargs["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY",
                                        "cudagraph_capture_sizes": sorted({1, 8, 32, *args.batches})}
    return kwargs


def _vllm_generate(llm, prompts: torch.Tensor, new_tokens: int, temperature: float) -> tuple[float, int]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    # ignore_eos alone makes every row run to max_tokens; min_tokens would add a logits processor
    # that the rollout never uses.
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=temperature, detokenize=False, seed=0)
    requests = [TokensPrompt(prompt_token_ids=row) for row in prompts.tolist()]
    start = time.perf_counter()
    outputs = llm.generate(requests, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    counts = [len(o.outputs[0].token_ids) for o in outputs]
    if min(counts) != new_tokens or max(counts) != new_tokens:
        raise RuntimeError(f"vLLM generated between {min(counts)} and {max(counts)} tokens, expected {new_tokens}")
    return seconds, sum(counts)


def run_vllm(shape, shape_name: str, args, deadline: float) -> dict:
    """vLLM engine over a config-only model folder (``load_format="dummy"``: random weights)."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # any import failure means: not measurable here, say why
        return {"engine": "vllm", "skipped": f"vllm does not import: {type(err).__name__}: {str(err)[:300]}"}
    with tempfile.TemporaryDirectory(prefix=f"bench_{shape_name}_") as model_dir:
        qwen2_config(shape).save_pretrained(model_dir)
        kwargs = vllm_kwargs(args, max(args.batches))
        start = time.perf_counter()
        try:
            from vllm import LLM

            llm = LLM(model=model_dir, **kwargs)
        except Exception as err:
            return {"engine": "vllm", "skipped": f"engine construction failed: {type(err).__name__}: {str(err)[:400]}",
                    "engine_kwargs": kwargs}
        report = {"engine": "vllm", "version": vllm.__version__, "mode": args.vllm_mode, "engine_kwargs": kwargs,
                  "engine_in_process": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0",
                  "construct_s": round(time.perf_counter() - start, 1), "model_runner": _runner_version(llm),
                  "runs": []}
        _vllm_generate(llm, random_prompts(8, args.prompt_len, shape.vocab_size, seed=1), 16, args.temperature)
        for batch in args.batches:
            if time.perf_counter() > deadline:
                report["runs"].append({"batch": batch, "skipped": "script time budget (--time_budget_s) exhausted"})
                continue
            report["runs"].append(measure_vllm(llm, batch, shape, args))
        if args.profile_steps:
            report["decode_profile"] = profile_decode(llm, max(args.batches), args.profile_steps, shape, args)
        _shutdown(llm)
    return report


def measure_vllm(llm, batch: int, shape, args) -> dict:
    """One ``generate`` of ``batch`` prompts, its rate against the bound and its decode-only rate."""
    prompts = random_prompts(batch, args.prompt_len, shape.vocab_size)
    probe_ms = round(host_probe_ms(), 1)
    seconds, tokens = _vllm_generate(llm, prompts, args.new_tokens, args.temperature)
    tps = tokens / seconds
    run = {"batch": batch, "host_probe_ms": probe_ms, "seconds": round(seconds, 3), "generated_tokens": tokens,
           "tokens_per_s": round(tps, 1), **bound_fields(shape, batch, args, tps)}
    run.update(decode_only(llm, prompts, seconds, shape, args))
    print(f"  vllm batch {batch:5d}: {tps:10.1f} tok/s ({seconds:.1f} s, host probe {probe_ms} ms); "
          f"decode only {run['decode_tokens_per_s']:.1f} tok/s = {run['decode_fraction_of_bound']:.1%} of bound",
          flush=True)
    return run


def _runner_version(llm) -> str:
    """'v2' or 'v1': which vLLM GPU model runner the engine chose (``VLLM_USE_V2_MODEL_RUNNER``)."""
    try:
        return "v2" if llm.llm_engine.vllm_config.use_v2_model_runner else "v1"
    except AttributeError:  # versions without the V2 runner
        return "v1"


def decode_only(llm, prompts: torch.Tensor, seconds: float, shape, args) -> dict:
    """Decode rate without the prefill: the same prompts with 1 new token give the prefill time.

    The bandwidth bound is a decode bound (weights + KV read per decode step), so the decode-only
    rate ``batch * (new_tokens - 1) / (seconds - prefill_s)`` is its like-for-like comparison; the
    end-to-end ``tokens_per_s`` (prefill included) stays in the report beside it.
    """
    prefill_s, _ = _vllm_generate(llm, prompts, 1, args.temperature)
    batch = prompts.shape[0]
    rate = batch * (args.new_tokens - 1) / max(seconds - prefill_s, 1e-9)
    bound = bound_fields(shape, batch, args, rate)
    return {"prefill_s": round(prefill_s, 3), "decode_tokens_per_s": round(rate, 1),
            "decode_fraction_of_bound": bound["fraction_of_bound"]}


def profile_decode(llm, batch: int, steps: int, shape, args) -> dict:
    """Where a decode step's wall time goes: GPU kernel time vs the rest (scheduling, input
    preparation, sampling bookkeeping on the CPU), from torch's profiler over ``steps`` decode steps.

    ``gpu_busy_fraction`` = summed kernel time / wall time of the decode steps (prefill measured
    separately and subtracted, as in :func:`decode_only`); needs the engine in this process.
    """
    prompts = random_prompts(batch, args.prompt_len, shape.vocab_size, seed=2)
    prefill_s, prefill_kernels = _profiled(llm, prompts, 1, args.temperature)
    seconds, kernels = _profiled(llm, prompts, steps + 1, args.temperature)
    decode_s = max(seconds - prefill_s, 1e-9)
    decode_kernel_s = sum(kernels.values()) - sum(prefill_kernels.values())
    top = sorted(kernels, key=lambda k: -(kernels[k] - prefill_kernels.get(k, 0.0)))[:12]
    out = {"batch": batch, "decode_steps": steps, "wall_s": round(seconds, 3), "prefill_s": round(prefill_s, 3),
           "ms_per_decode_step": round(1e3 * decode_s / steps, 3),
           "kernel_ms_per_decode_step": round(1e3 * decode_kernel_s / steps, 3),
           "gpu_busy_fraction": round(decode_kernel_s / decode_s, 3),
           "top_decode_kernels_ms_per_step": {k[:80]: round(1e3 * (kernels[k] - prefill_kernels.get(k, 0.0)) / steps, 4)
                                              for k in top}}
    print(f"  decode profile batch {batch}: {out['ms_per_decode_step']} ms/step wall, "
          f"{out['kernel_ms_per_decode_step']} ms/step in kernels", flush=True)
    return out


def _profiled(llm, prompts: torch.Tensor, new_tokens: int, temperature: float) -> tuple[float, dict[str, float]]:
    """Wall seconds of one generate call and its GPU kernel seconds by kernel name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        seconds, _ = _vllm_generate(llm, prompts, new_tokens, temperature)
    return seconds, {e.key: e.self_device_time_total / 1e6 for e in prof.key_averages() if e.self_device_time_total > 0}


def _shutdown(llm) -> None:
    """Stop the engine so its GPU memory is free for the next shape."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # older/newer engines shut down on garbage collection instead
        pass
    del llm
    _free()


def project_engine_note() -> str:
    """Whether the project's vLLM rollout engine module exists (it drives the same ``vllm.LLM``)."""
    import importlib.util

    if importlib.util.find_spec("verl.workers.rollout.vllm_rollout") is None:
        return "verl/workers/rollout/vllm_rollout.py not present: vllm.LLM measured directly"
    return ("vllm.LLM measured directly (dummy random weights, token-id prompts, no tokenizer on the device), "
            "not through VLLMRolloutEngine, which needs a saved checkpoint and a tokenizer; same vLLM engine "
            "and sampling work")


# ------------------------------------------------------------------ report
def _median_run(runs: list[dict], key: str) -> dict:
    """The run at the median of ``key``; with an even count the lower of the two middle runs, so a
    goal checked against it is not met on the strength of the better half."""
    return sorted(runs, key=lambda r: r[key])[(len(runs) - 1) // 2]


def goals(shapes: dict) -> dict:
    """Ratios against the issue's goals: vLLM >= 3x generate at batch 256, >= 25% of bound (1.5B).

    vLLM figures are medians over the batch-256 runs (repeat ``256`` in ``--batches`` for more than
    one): the host-side share of a decode step varies from run to run on a shared host.
    """
    out = {}
    for name, res in shapes.items():
        hf = {r["batch"]: r for r in res.get("hf", []) if "tokens_per_s" in r}
        vllm = res.get("vllm", {})
        at_256 = [r for r in vllm.get("runs", []) if r.get("batch") == 256 and "tokens_per_s" in r]
        entry = {}
        if at_256:
            median = _median_run(at_256, "tokens_per_s")
            entry["vllm_runs_at_256"] = len(at_256)
            entry["vllm_fraction_of_bound_at_256"] = median["fraction_of_bound"]
            entry["vllm_decode_fraction_of_bound_at_256"] = _median_run(at_256, "decode_fraction_of_bound")[
                "decode_fraction_of_bound"]
            entry["goal_25pct_bound_met"] = entry["vllm_fraction_of_bound_at_256"] >= 0.25
            entry["goal_25pct_bound_met_decode_only"] = entry["vllm_decode_fraction_of_bound_at_256"] >= 0.25
            if 256 in hf:
                entry["vllm_over_generate_at_256"] = round(median["tokens_per_s"] / hf[256]["tokens_per_s"], 2)
                entry["goal_3x_met"] = entry["vllm_over_generate_at_256"] >= 3.0
        out[name] = entry
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.profile_steps:  # the profiler must see the engine core's CUDA work: keep it in-process
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # In-process engine unless the caller chose: this process has initialised CUDA (the transformers
    # runs) before vLLM starts, and a multiprocess engine would fork after that and fail.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    args.batches = [int(b) for b in args.batches.split(",")]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.dtype_name = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    dtype = getattr(torch, args.dtype_name)
    engines = set(args.engines.split(","))
    deadline = time.perf_counter() + args.time_budget_s
    report = {"benchmark": "generation", "weights": "random init (no pretrained weights; throughput only)",
              "device": device, "dtype": args.dtype_name, "prompt_len": args.prompt_len,
              "new_tokens": args.new_tokens, "batches": args.batches, "temperature": args.temperature,
              "hbm_bytes_per_s": HBM_BYTES_PER_S,
              "bound_formula": "batch / ((matmul_params*2 + batch*(prompt_len+new_tokens/2)*kv_bytes_per_token) / 4.8e12)",
              "tokens_per_s_includes_prefill": True, "shapes": {}}
    for name in args.shapes.split(","):
        shape = get_shape(name)
        print(f"shape {name}: {shape}", flush=True)
        entry = report["shapes"][name] = {"config": shape.as_dict()}
        if "hf" in engines:
            entry["hf"] = run_hf(shape, args, dtype, device, deadline)
            save_report(args.name, report, args.out_dir, quiet=True)
        if "vllm" in engines:
            entry["vllm"] = run_vllm(shape, name, args, deadline)
            entry["vllm"]["project_engine"] = project_engine_note()
            save_report(args.name, report, args.out_dir, quiet=True)
    report["goals"] = goals(report["shapes"])
    save_report(args.name, report, args.out_dir)
    return report


if __name__ == "__main__":
    main()
