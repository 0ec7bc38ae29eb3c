"""Training throughput and MFU of the project's PPO actor update on one GPU.

For each model shape (Qwen2.5 architectures, **random weights**, see ``benchmarks/shapes.py``) one
batch of ``--rows`` rows is built with a realistic length spread:

* prompts: lengths uniform in ``[--prompt_min, --prompt_max]`` (default 200-300 tokens), left padded;
* responses: lognormal lengths with median ``--resp_median`` (120) and sigma ``--resp_sigma`` (0.8),
  clipped to ``[--resp_min, --resp_max]`` (20-500), right padded. This mimics Search-R1 rollouts:
  most answers are short, a tail of multi-turn trajectories runs to the 500-token cap.

Configurations run on the same batch, each one warm-up step then ``--steps`` timed steps:

* ``actor_packed``: ``DataParallelPPOActor.update_policy`` (verl/workers/actor/dp_actor.py) on an
  FSDP2 model (``verl.utils.fsdp_utils.apply_fsdp2``, a world of one rank: nccl on GPU, gloo on CPU;
  bf16 params / fp32 reduce on GPU), gradient checkpointing, AdamW, ``use_remove_padding=True``
  with ``use_dynamic_bsz`` micro-batches of at most ``--max_token_len`` tokens, packed into rows of
  at most ``--pack_row_len`` tokens (sdpa's block-diagonal mask costs O(row_len^2)), log-probs and
  entropy from the last hidden states ``--logits_chunk`` tokens at a time (no full-vocab logits);
* ``actor_padded``: the same with ``use_remove_padding=False`` and ``--micro_rows`` rows per
  micro-batch (padded to the batch's longest prompt + response);
* ``baseline_padded``: a plain transformers loop on the same padded micro-batches: fp32 weights,
  ``torch.autocast(bf16)`` on GPU, gradient checkpointing, token-mean cross-entropy on response
  tokens, AdamW step.

Suffixes: ``_nockpt`` turns gradient checkpointing off (e.g. ``actor_packed_nockpt``,
``baseline_padded_nockpt``); ``_flex`` uses ``attn_implementation="flex_attention"`` (block-sparse
mask, so packed rows are not capped); ``_varlen`` uses ``torch_varlen`` (torch's varlen flash kernel,
:mod:`verl.utils.varlen_attention`: no mask, one packed row per micro-batch). The actor configs only compute LM-head logits where a
response token is predicted; the FLOP count below still charges the head for every token.

tokens/s counts valid (non-padding) tokens. MFU = useful FLOPs / time / 989e12 (H200 dense bf16),
with useful FLOPs = ``6 * matmul_params * tokens + sum_rows 6 * L * d_attn * s^2`` (causal attention,
forward + backward; see :func:`benchmarks.shapes.train_flops`); padding and checkpoint recomputation
are not counted. ``mfu_head_on_responses`` is the stricter count: the LM head charged only for the
response-predicting tokens the loss needs. Peak memory is ``torch.cuda.max_memory_allocated`` during the timed steps.

CPU smoke test: ``python benchmarks/gpu_train.py --shapes tiny --rows 8 --prompt_min 8 --prompt_max 12
--resp_min 2 --resp_max 20 --resp_median 8 --max_token_len 128 --micro_rows 4 --steps 1 --pack_row_len 48``
(``_flex`` configs are recorded as skipped on CPU: flex attention has no CPU backward).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import save_report  # noqa: E402
from benchmarks.shapes import build_random_model, get_shape, train_flops  # noqa: E402
from verl.utils import varlen_attention  # noqa: E402

varlen_attention.register()  # the _varlen configs build models with attn_implementation="torch_varlen"

PEAK_BF16_FLOPS = 989e12  # H200 dense bf16 tensor-core peak
ATTN_SUFFIXES = {"flex": "flex_attention", "varlen": "torch_varlen"}  # config suffix -> attn_implementation


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b")
    parser.add_argument("--configs", default="actor_packed_nockpt,baseline_padded_nockpt,actor_packed,baseline_padded,"
                                             "actor_padded,actor_packed_flex_nockpt")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--prompt_min", type=int, default=200)
    parser.add_argument("--prompt_max", type=int, default=300)
    parser.add_argument("--resp_min", type=int, default=20)
    parser.add_argument("--resp_max", type=int, default=500)
    parser.add_argument("--resp_median", type=float, default=120.0)
    parser.add_argument("--resp_sigma", type=float, default=0.8)
    parser.add_argument("--max_token_len", type=int, default=16384, help="packed micro-batch token budget")
    parser.add_argument("--micro_rows", type=int, default=16, help="rows per padded micro-batch")
    parser.add_argument("--pack_row_len", type=int, default=4096,
                        help="max tokens per packed row (actor max_packed_row_len; 0: one row per micro-batch)")
    parser.add_argument("--logits_chunk", type=int, default=4096,
                        help="actor logits_chunk_size (0: full-vocab logits of every token, the old path)")
    parser.add_argument("--no_grad_ckpt", action="store_true",
                        help="gradient checkpointing off in every configuration (same as the _nockpt suffix)")
    parser.add_argument("--steps", type=int, default=2, help="timed updates after one warm-up update")
    parser.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, flex_attention, ...)")
    parser.add_argument("--time_budget_s", type=float, default=300.0,
                        help="start no new configuration after this many seconds")
    parser.add_argument("--compile", default="none", choices=["none", "head", "layers", "both"],
                        help="torch.compile the log-prob/entropy chunks (head), each decoder layer, or both")
    parser.add_argument("--profile", action="store_true", help="also record one update's top ops (torch.profiler)")
    parser.add_argument("--out_dir", default=None)
    parser.add_argument("--name", default="gpu_train")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


# ------------------------------------------------------------------ batch
def sample_lengths(args) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and response lengths ``(rows,)`` (see the module docstring for the distribution)."""
    rng = np.random.default_rng(args.seed)
    prompt = rng.integers(args.prompt_min, args.prompt_max + 1, size=args.rows)
    resp = rng.lognormal(np.log(args.resp_median), args.resp_sigma, size=args.rows)
    resp = np.clip(np.round(resp), args.resp_min, args.resp_max).astype(int)
    return prompt, resp


def build_batch(prompt_lens: np.ndarray, resp_lens: np.ndarray, vocab_size: int, seed: int = 0) -> dict:
    """Left-padded prompts + right-padded responses in the DataProto layout of docs/architecture.md.

    Returns tensors ``input_ids``, ``attention_mask``, ``position_ids`` ``(B, T)``, ``responses``,
    ``response_mask``, ``old_log_probs``, ``advantages`` ``(B, R)``.
    """
    gen = torch.Generator().manual_seed(seed)
    rows, p_max, r_max = len(prompt_lens), int(prompt_lens.max()), int(resp_lens.max())
    input_ids = torch.randint(0, vocab_size - 1, (rows, p_max + r_max), generator=gen)
    pos = torch.arange(p_max + r_max)
    prompt_valid = pos[None, :p_max] >= (p_max - torch.as_tensor(prompt_lens))[:, None]
    resp_valid = pos[None, :r_max] < torch.as_tensor(resp_lens)[:, None]
    attention_mask = torch.cat([prompt_valid, resp_valid], dim=1).long()
    response_mask = resp_valid.float()
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": input_ids[:, p_max:], "response_mask": response_mask,
            # a random model is near uniform: old log-probs ~ -log(V) keep PPO ratios near 1
            "old_log_probs": torch.full((rows, r_max), -float(np.log(vocab_size))) * response_mask,
            "advantages": torch.randn(rows, r_max, generator=gen) * response_mask}


# ------------------------------------------------------------------ configurations
def actor_config(args, packed: bool) -> dict:
    """The actor's ``ActorConfig`` keys for the update under test."""
    return {"ppo_mini_batch_size": args.rows, "ppo_micro_batch_size_per_gpu": args.micro_rows,
            "use_dynamic_bsz": packed, "ppo_max_token_len_per_gpu": args.max_token_len,
            "ppo_epochs": 1, "shuffle": False, "grad_clip": 1.0,
            "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
            "entropy_coeff": 0.001, "loss_agg_mode": "token-mean", "use_kl_loss": False,
            "tis_imp_ratio_cap": -1.0, "policy_loss": {"loss_mode": "vanilla"}}


def forward_layout(args, packed: bool, pack_row_len: int, row_multiple: int):
    """The forward layout under test; logit chunking and row rounding are this benchmark's knobs."""
    from verl.workers.forward import ForwardLayout

    return ForwardLayout(use_remove_padding=packed, max_packed_row_len=pack_row_len,
                         logits_chunk_size=args.logits_chunk, packed_row_multiple=row_multiple,
                         compiled_token_stats=args.compile in ("head", "both"))


def _model(shape, args, variant: dict):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_random_model(shape, torch.float32, device, attn_implementation=variant["attn"], seed=args.seed)
    if variant["grad_ckpt"]:
        # as verl.utils.fsdp_utils._finish_model: non-reentrant checkpointing works with FSDP2
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    if args.compile in ("layers", "both"):
        from verl.utils.fsdp_utils import compile_decoder_layers

        compile_decoder_layers(model)  # per block, before FSDP2, as the workers do
    return model.train()


def make_actor_step(shape, args, batch: dict, packed: bool, variant: dict):
    """One ``update_policy`` call of the real actor on an FSDP2-wrapped model."""
    from verl.protocol import DataProto
    from verl.utils.config import to_typed
    from verl.utils.fsdp_utils import apply_fsdp2
    from verl.workers.actor.config import ActorConfig
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.batching import actor_update_batching

    model = apply_fsdp2(_model(shape, args, variant))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    # flex attention skips masked blocks itself: one packed row per micro-batch, its length rounded
    # to 2048 so the compiled kernel sees few distinct shapes; sdpa: rows of <= --pack_row_len
    # tokens, a multiple of 64 (aligned mask for the memory-efficient kernel)
    flex = variant["attn"] == "flex_attention"
    config = to_typed(ActorConfig, actor_config(args, packed))
    layout = forward_layout(args, packed, 0 if flex else args.pack_row_len, 2048 if flex else 64)
    actor = DataParallelPPOActor(config, model, optimizer, layout=layout,
                                 update=actor_update_batching(config, rollout_n=1, world_size=1))
    device = next(model.parameters()).device
    data = DataProto.from_dict(tensors={k: v.to(device) for k, v in batch.items()})
    return (lambda: actor.update_policy(data, 1.0)), (model, optimizer, actor, data)


def make_baseline_step(shape, args, batch: dict, variant: dict):
    """A plain transformers forward/backward/AdamW loop over padded micro-batches of the same rows."""
    model = _model(shape, args, variant)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    device = next(model.parameters()).device
    tensors = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "position_ids", "response_mask")}
    resp_len = tensors["response_mask"].shape[1]
    total_tokens = tensors["response_mask"].sum()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, args.rows, args.micro_rows):
            micro = {k: v[start:start + args.micro_rows] for k, v in tensors.items()}
            with autocast:
                logits = model(input_ids=micro["input_ids"], attention_mask=micro["attention_mask"],
                               position_ids=micro["position_ids"], use_cache=False).logits
            logits = logits[:, -resp_len - 1:-1].float()
            targets = micro["input_ids"][:, -resp_len:]
            nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                    reduction="none").view_as(targets)
            ((nll * micro["response_mask"]).sum() / total_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step, (model, optimizer)


# ------------------------------------------------------------------ measurement
def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_top_ops(step, top: int = 25) -> list[dict]:
    """One ``step`` under torch.profiler: the ``top`` ops by device (else CPU) self time, in ms."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        step()
        _sync()
    key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:top]
    return [{"op": e.key[:80], "calls": e.count, "self_ms": round(getattr(e, key) / 1e3, 2)} for e in events]


def measure(step, steps: int, flops: dict, profile_ops: bool = False) -> dict:
    """Warm-up once, then time ``steps`` calls; tokens/s, MFU and peak memory (and top ops if asked)."""
    step()
    _sync()
    top_ops = profile_top_ops(step) if profile_ops else None
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync()
    seconds = (time.perf_counter() - start) / steps
    return {"seconds_per_update": round(seconds, 4), "tokens_per_update": flops["tokens"],
            "tokens_per_s": round(flops["tokens"] / seconds, 1),
            "achieved_tflops": float(f"{flops['total_flops'] / seconds / 1e12:.4g}"),
            "mfu": float(f"{flops['total_flops'] / seconds / PEAK_BF16_FLOPS:.4g}"),
            "mfu_head_on_responses": float(f"{flops['flops_head_on_responses'] / seconds / PEAK_BF16_FLOPS:.4g}"),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None,
            **({"profile_top_ops": top_ops} if top_ops else {})}


def parse_config(name: str, args) -> tuple[str, dict]:
    """``actor_packed_flex_nockpt`` -> ``("actor_packed", {"attn": "flex_attention", "grad_ckpt": False})``;
    ``_varlen`` selects ``torch_varlen`` (:mod:`verl.utils.varlen_attention`).

    Raises:
        ValueError: unknown base name or suffix.
    """
    marked = name
    for suffix in [*ATTN_SUFFIXES, "nockpt"]:
        marked = marked.replace("_" + suffix, "|" + suffix)
    base, *suffixes = marked.split("|")
    attn = [ATTN_SUFFIXES[s] for s in suffixes if s in ATTN_SUFFIXES]
    if base not in ("actor_packed", "actor_padded", "baseline_padded") or len(attn) > 1 \
            or not set(suffixes) <= set(ATTN_SUFFIXES) | {"nockpt"}:
        raise ValueError(f"unknown config {name!r}; expected actor_packed, actor_padded or baseline_padded, "
                         f"optionally with one of {sorted('_' + s for s in ATTN_SUFFIXES)} and/or _nockpt")
    return base, {"attn": attn[0] if attn else args.attn, "grad_ckpt": not (args.no_grad_ckpt or "nockpt" in suffixes)}


def run_config(name: str, shape, args, batch: dict, flops: dict) -> dict:
    base, variant = parse_config(name, args)
    try:
        if base == "baseline_padded":
            step, keep = make_baseline_step(shape, args, batch, variant)
        else:
            step, keep = make_actor_step(shape, args, batch, base == "actor_packed", variant)
    except Exception as err:  # e.g. flex_attention unavailable: record it, keep measuring the others
        return {"skipped": f"setup failed: {type(err).__name__}: {str(err)[:300]}", **variant}
    try:
        return {**measure(step, args.steps, flops, args.profile), **variant}
    except torch.OutOfMemoryError as err:
        return {"skipped": f"out of memory: {str(err)[:200]}", **variant}
    except Exception as err:  # a failing variant (e.g. flex compile) must not lose the others
        return {"skipped": f"failed: {type(err).__name__}: {str(err)[:300]}", **variant}
    finally:
        del step, keep
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def goals(shapes: dict) -> dict:
    """The issue's goals per packed variant: MFU >= 40% (1.5B), >= 1.5x the padded baseline's tokens/s.

    Each packed run is compared with the baseline of the same checkpointing setting and with the
    fastest baseline of the run (the stricter comparison).
    """
    out = {}
    for name, res in shapes.items():
        runs, entry = res["runs"], {}
        baselines = {k: v for k, v in runs.items() if k.startswith("baseline_padded") and "tokens_per_s" in v}
        best_base = max(baselines.values(), key=lambda r: r["tokens_per_s"], default=None)
        for config, run in runs.items():
            if not config.startswith("actor_packed") or "mfu" not in run:
                continue
            strict = run.get("mfu_head_on_responses", run["mfu"])
            item = {"mfu": run["mfu"], "mfu_head_on_responses": strict, "goal_mfu_40pct_met": strict >= 0.40}
            same = baselines.get("baseline_padded" + ("" if run.get("grad_ckpt", True) else "_nockpt"))
            if same:
                item["over_baseline_same_ckpt"] = round(run["tokens_per_s"] / same["tokens_per_s"], 2)
            if best_base:
                item["over_fastest_baseline"] = round(run["tokens_per_s"] / best_base["tokens_per_s"], 2)
                item["goal_1_5x_met"] = item["over_fastest_baseline"] >= 1.5
            entry[config] = item
        out[name] = entry
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    deadline = time.perf_counter() + args.time_budget_s
    prompt_lens, resp_lens = sample_lengths(args)
    report = {"benchmark": "train_update_actor", "weights": "random init (no pretrained weights; throughput only)",
              "device": "cuda" if torch.cuda.is_available() else "cpu", "rows": args.rows, "attn": args.attn,
              "max_token_len": args.max_token_len, "compile": args.compile, "pack_row_len": args.pack_row_len,
              "logits_chunk": args.logits_chunk, "micro_rows": args.micro_rows, "steps": args.steps,
              "length_distribution": {
                  "prompt": f"uniform integer [{args.prompt_min}, {args.prompt_max}]",
                  "response": f"lognormal(median {args.resp_median}, sigma {args.resp_sigma}) "
                              f"clipped to [{args.resp_min}, {args.resp_max}]",
                  "prompt_mean": float(prompt_lens.mean()), "response_mean": float(resp_lens.mean()),
                  "response_p50_p90_max": [int(np.percentile(resp_lens, 50)), int(np.percentile(resp_lens, 90)),
                                           int(resp_lens.max())],
                  "padding_fraction": round(1 - float((prompt_lens + resp_lens).sum())
                                            / (args.rows * (prompt_lens.max() + resp_lens.max())), 4)},
              "peak_flops": PEAK_BF16_FLOPS,
              "flops_formula": "6*matmul_params*valid_tokens + sum_rows 6*L*num_heads*head_dim*len^2 (causal attn, fwd+bwd)",
              "shapes": {}}
    for shape_name in args.shapes.split(","):
        shape = get_shape(shape_name)
        batch = build_batch(prompt_lens, resp_lens, shape.vocab_size, args.seed)
        flops = train_flops(shape, [int(p + r) for p, r in zip(prompt_lens, resp_lens)])
        # the loss needs the LM head only where a response token is predicted: the stricter count
        flops["flops_head_on_responses"] = flops["total_flops"] - 6.0 * shape.vocab_size * shape.hidden_size * int(
            prompt_lens.sum())
        entry = report["shapes"][shape_name] = {"config": shape.as_dict(), "flops_per_update": flops, "runs": {}}
        for config in args.configs.split(","):
            if time.perf_counter() > deadline:
                entry["runs"][config] = {"skipped": "script time budget (--time_budget_s) exhausted"}
                continue
            print(f"shape {shape_name} config {config} ...", flush=True)
            entry["runs"][config] = result = run_config(config, shape, args, batch, flops)
            print(f"  {result}", flush=True)
            save_report(args.name, report, args.out_dir, quiet=True)
    report["goals"] = goals(report["shapes"])
    save_report(args.name, report, args.out_dir)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return report


if __name__ == "__main__":
    main()
