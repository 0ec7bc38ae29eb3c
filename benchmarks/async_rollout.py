"""Sync vs async multi-turn rollout (issue 20): same batch, model, seed and retriever, one run each.

    # GPU (H200), the issue's shapes: SmolLM2 warm start at Search-R1's shape, random-init 1.5B / 3B,
    # then whole GRPO steps; one call does all (long), or split it, each call extending the last:
    python benchmarks/async_rollout.py --out_dir $OUT
    python benchmarks/async_rollout.py --models warm_start --step_model none --out_dir $OUT
    python benchmarks/async_rollout.py --models qwen2.5-1.5b --step_model none --merge_from PREVIOUS.json ...
    # CPU smoke shape (2 cores)
    python benchmarks/async_rollout.py --device cpu --models base,tiny --batch_size 8 --n 2 --max_turns 2 \\
        --max_tokens 96 --max_obs_length 128 --max_prompt_length 1536 --step_model base --step_batch_size 4 \
        --step_n 2 --step_steps 2 --report_name async_rollout_cpu

Rollouts (``rollout`` section): for each model, one vLLM engine is built and reused; each of
``sync`` and ``async`` rolls out the same ``batch_size x n`` rows at temperature 1 against (a) the
local BM25 server over ``example/corpus.jsonl`` and (b) the same server behind
``benchmarks/latency_proxy.py`` (log-normal online-search latency, ``--latency_ms``). Reported per
run: wall time, generated tokens/s, the engine's busy fraction (sync: time inside ``generate`` /
wall; async: time with at least one request in the engine / wall), searches in flight (async: mean
and peak; sync: the proxy's peak requests), turns and searches per row; with ``--engine_stats``, vLLM's
counters over the run (:data:`ENGINE_COUNTERS`: preemptions, prompt tokens, prefix-cache hits) and the
prompt tokens it prefilled (``prefilled_tokens``: prompt tokens less prefix-cache hits).
``--num_kv_blocks`` caps the KV cache, to see what a smaller cache (a larger model's) does to each mode.

Models: ``warm_start`` is the SmolLM2-135M SFT warm start (``scripts/warm_start.py``, built and
cached on first use) writing its own tags; ``base`` is SmolLM2 as shipped, every prompt opening
``<think>...</think><search>`` (it rarely searches on its own); ``qwen2.5-1.5b`` and ``qwen2.5-3b``
are random-init shapes (``benchmarks/shapes.py``), ``tiny`` a 2-layer random Qwen2 with the real Qwen
tokenizer (``save_random_model.build_tiny_causal_lm``, for CPU runs). A random model never closes a tag, so
for those shapes the benchmark closes each turn itself (:class:`ForcedTurns`): the engine decodes a
drawn number of real tokens (log-normal, long-tailed, up to ``--max_tokens``), then the turn gets
``<search> question </search>`` (or, with probability ``--answer_prob``, ``<answer>``) appended
(benchmark-only; the trajectories exercise long multi-turn contexts with real decoding work).

Steps (``step``: a list of sections, one a run, each naming its ``recipe``): ``--step_steps`` GRPO steps
of the real trainer (``scripts/quickstart.py`` on the example data, the ``--step_model``, with the
``--step_recipe`` recipes stacked) in each mode behind the latency proxy; the step time is
the mean ``timing_s/step`` after the first step (``step_s_range``: their min and max; ``per_step``: each
step's split); a third run (``sync_staleness1``) rolls out each step's batch beside the previous
step's update (``rollout.staleness=1``); ``split_staleness1`` (``--step_variants``, two GPUs) does the same
with the engine on a GPU of its own (split pools: ``actor_rollout_ref.hybrid_engine=false``). Top-level ratios (sync time / async time): ``ratio_rollout_local`` and ``ratio_rollout_latency`` of the 1.5B shape (else the
warm start, else the first model; ``ratio_rollout_model`` names it), and of the newest step section
without a recipe (the benchmark's own step shape): ``ratio_step_latency``, ``ratio_step_staleness``
(sync step time at staleness 0 / at 1), and with split pools ``ratio_step_staleness_split``
(staleness 0 colocated / staleness 1 split). ``--engine_process`` puts vLLM's
engine core in a process of its own for every rollout and step (``rollout.engine_process``), so the
async tasks and the HTTP client no longer share an interpreter with the scheduler and the model.
Each rollout entry and step section records ``made_by`` (commit, date, GPU, engine settings): a report
extended with ``--merge_from`` holds sections of several runs; a model measured again (a repeat, another
engine setting or GPU) gets an entry of its own beside the earlier ones, and the headline is its newest.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
for _path in (str(REPO), str(REPO / "scripts")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks.common import run_metadata, save_report  # noqa: E402
from benchmarks.gpu_generation import host_probe_ms  # noqa: E402
from benchmarks.latency_proxy import launch_proxy  # noqa: E402
from verl.trainer.overrides import recipe_overrides  # noqa: E402

PREFIX = "<think>I need to look this up.</think>\n<search>"
RANDOM_SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "tiny")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--models", default="warm_start,qwen2.5-1.5b,qwen2.5-3b",
                   help="comma list of warm_start, base, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, tiny")
    p.add_argument("--batch_size", type=int, default=512, help="prompts (x --n samples)")
    p.add_argument("--n", type=int, default=5)
    p.add_argument("--max_turns", type=int, default=4)
    p.add_argument("--max_tokens", type=int, default=500, help="new tokens per turn")
    p.add_argument("--max_obs_length", type=int, default=500)
    p.add_argument("--max_prompt_length", type=int, default=4096)
    p.add_argument("--latency_ms", default="200,1500", help="2.5%%,97.5%% quantiles of a query's latency")
    p.add_argument("--max_concurrency", type=int, default=256, help="retriever.max_concurrency")
    p.add_argument("--answer_prob", type=float, default=0.3, help="random shapes: chance a turn answers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu_memory_utilization", type=float, default=0.6)
    p.add_argument("--enforce_eager", action="store_true", help="vLLM without CUDA graphs (faster start)")
    p.add_argument("--max_num_seqs", type=int, default=None,
                   help="vLLM's running batch, sequences (default: vLLM's, 1,024 on an H200)")
    p.add_argument("--engine_stats", action="store_true",
                   help="vLLM's statistics on (disable_log_stats=False): each rollout records its preemptions, "
                        "prompt tokens and prefix-cache hits")
    p.add_argument("--num_kv_blocks", type=int, default=None,
                   help="vLLM's KV cache in blocks (num_gpu_blocks_override; default: what memory allows)")
    p.add_argument("--engine_process", action="store_true",
                   help="vLLM's engine core in a process of its own (rollout.engine_process), both modes and steps")
    p.add_argument("--step_model", default="warm_start", help="model of the step runs (warm_start | base | none)")
    p.add_argument("--step_batch_size", type=int, default=128)
    p.add_argument("--step_n", type=int, default=5)
    p.add_argument("--step_steps", type=int, default=3)
    p.add_argument("--step_variants", default="sync,async,sync_staleness1",
                   help=f"comma list of {', '.join(STEP_VARIANTS)} (split_staleness1 needs two GPUs)")
    p.add_argument("--step_recipe", default="",
                   help="recipes stacked on the step runs (e.g. learning_gpu); the flags still set the batch and lengths")
    p.add_argument("--out_dir", default=None, help="default benchmarks/results (on the device: $OUT)")
    p.add_argument("--report_name", default="async_rollout", help="JSON file name (without .json)")
    p.add_argument("--merge_from", default=None,
                   help="an earlier async_rollout.json whose rollout entries / step this run extends "
                        "(split a long device session into several calls)")
    return p.parse_args(argv)


# ---- models and prompts ---------------------------------------------------------------------------
def model_path(name: str, work_dir: Path) -> str:
    from verl.utils.model_zoo import smollm2_dir

    if name == "base":
        return smollm2_dir()
    if name == "warm_start":
        from warm_start import ensure_warm_start
        return ensure_warm_start()
    if name == "tiny":  # a 2-layer random Qwen2 with the real Qwen tokenizer (CPU smoke runs)
        from benchmarks.save_random_model import build_tiny_causal_lm
        return build_tiny_causal_lm(work_dir / name, arch="qwen2")
    if name in RANDOM_SHAPES:
        from benchmarks.save_random_model import save_random_model
        from verl.utils.model_zoo import qwen_tokenizer_dir
        return save_random_model(name, qwen_tokenizer_dir(), str(work_dir / name))
    raise ValueError(f"unknown model {name!r}")


def questions(count: int) -> list[str]:
    rows = [json.loads(line) for path in sorted((REPO / "example" / "qa").glob("*/*.jsonl"))
            for line in open(path)]  # the 730 bundled questions, cycled past that
    return [rows[i % len(rows)]["question"] for i in range(count)]


def prompts_for(tokenizer, name: str, args) -> list[list[int]]:
    """``batch_size`` Search-R1 prompts, each repeated ``n`` times (a GRPO group is adjacent)."""
    from search_r1.envs.search_r1.prompts import make_prefix

    prefix = PREFIX if name == "base" else ""  # random shapes: ForcedTurns writes the tags
    out = []
    for question in questions(args.batch_size):
        messages = [{"role": "user", "content": make_prefix(question)}]
        if tokenizer.chat_template:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = make_prefix(question)
        out += [tokenizer.encode(text + prefix, add_special_tokens=False)] * args.n
    return out


class ForcedTurns:
    """Benchmark-only engine wrapper that closes the turns of a random-init model (module docstring).

    A turn's length and action are drawn from a hash of its context, so both modes see the same
    draws for the same context. The appended tag tokens get log-prob 0 (not sampled).
    """

    def __init__(self, engine, tokenizer, max_tokens: int, answer_prob: float):
        self.engine, self.tokenizer = engine, tokenizer
        self.max_tokens, self.answer_prob = max_tokens, answer_prob
        self._driver = None
        self._queries = questions(64)

    def _draw(self, context: list[int]) -> tuple[int, list[int]]:
        seed = int.from_bytes(hashlib.blake2b(repr(context).encode(), digest_size=8).digest(), "little")
        rng = random.Random(seed)
        length = int(min(self.max_tokens, max(8, rng.lognormvariate(4.5, 0.8))))
        if rng.random() < self.answer_prob:
            tag = " <answer> unknown </answer>"
        else:
            tag = f" <search> {rng.choice(self._queries)} </search>"
        return length, self.tokenizer.encode(tag, add_special_tokens=False)

    def _plan(self, context, params):
        length, tag = self._draw(context)
        length = min(length, params.max_tokens - len(tag))
        return (dataclasses.replace(params, max_tokens=length), tag) if length > 0 else (params, [])

    def _close(self, out, tag, stop_str, params):
        from verl.workers.rollout.base import RolloutOutput

        if out.finish_reason != "length" or not tag:
            return out
        log_probs = list(out.log_probs) + [0.0] * len(tag) if params.logprobs else []
        return RolloutOutput(out.token_ids + tag, log_probs, "stop", stop_str)

    def generate(self, prompt_token_ids, params):
        from vllm.inputs import TokensPrompt

        # no per-request seed here: one seed for all would make a GRPO group's samples identical
        plans = [self._plan(p, dataclasses.replace(params, seed=None)) for p in prompt_token_ids]
        llm = self.engine.llm
        requests = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompt_token_ids],
                                [self.engine.to_vllm_params(plan) for plan, _ in plans], use_tqdm=False)
        return [self._close(self.engine._convert(r.outputs[0], plan), tag, self._stop(tag), params)
                for r, (plan, tag) in zip(requests, plans)]

    async def agenerate(self, prompt_token_ids, params):
        from verl.workers.rollout.async_engine import VLLMStepDriver

        if self._driver is None:
            self._driver = VLLMStepDriver(self.engine)
        plan, tag = self._plan(prompt_token_ids, params)
        out = await self._driver.agenerate(prompt_token_ids, plan)
        return self._close(out, tag, self._stop(tag), params)

    @property
    def meter(self):
        return self._driver.meter

    @meter.setter
    def meter(self, value):
        from verl.workers.rollout.async_engine import VLLMStepDriver

        if self._driver is None:
            self._driver = VLLMStepDriver(self.engine)
        self._driver.meter = value

    def close(self, error=None):
        if self._driver is not None:
            self._driver.close(error)

    def _stop(self, tag: list[int]) -> str:
        return "</answer>" if tag and "</answer>" in self.tokenizer.decode(tag) else "</search>"


# ---- rollouts -----------------------------------------------------------------------------------
def build_engine(path: str, tokenizer, args):
    from verl.workers.rollout import build_rollout_engine

    gpu = args.device == "cuda"
    config = {"name": "vllm", "dtype": "bfloat16" if gpu else "float32",
              "max_model_len": args.max_prompt_length + args.max_tokens, "gpu_memory_utilization":
              args.gpu_memory_utilization, "kv_cache_space_gib": 2, "seed": args.seed,
              "enforce_eager": True if args.enforce_eager else None, "engine_process": args.engine_process,
              "max_num_seqs": args.max_num_seqs}
    extra = {"disable_log_stats": False} if args.engine_stats else {}
    if args.num_kv_blocks:
        extra["num_gpu_blocks_override"] = args.num_kv_blocks
    return build_rollout_engine(config, path, tokenizer, extra_engine_kwargs=extra)


ENGINE_COUNTERS = {"vllm:num_preemptions": "preemptions", "vllm:prompt_tokens": "prompt_tokens",
                   "vllm:prefix_cache_queries": "prefix_cache_queries", "vllm:prefix_cache_hits": "prefix_cache_hits"}
"""vLLM's counters a rollout records with ``--engine_stats`` (their change over the rollout): requests
preempted (dropped from the KV cache, recomputed later), prompt tokens of its requests, and of those the
tokens looked up in / found in the prefix cache (a found token is not prefilled again)."""


def engine_counters(engine) -> dict[str, int] | None:
    """The :data:`ENGINE_COUNTERS` so far; None when the engine keeps no statistics."""
    llm = getattr(engine, "engine", engine).llm  # through ForcedTurns
    if not getattr(llm.llm_engine, "log_stats", False):
        return None
    counts = dict.fromkeys(ENGINE_COUNTERS.values(), 0)
    for metric in llm.get_metrics():
        if metric.name in ENGINE_COUNTERS:
            counts[ENGINE_COUNTERS[metric.name]] += int(metric.value)
    return counts


def one_rollout(engine, tokenizer, retriever, prompts, mode: str, args, proxy=None) -> dict:
    """One rollout of ``prompts`` in ``mode``; its figures."""
    from search_r1.envs.search_r1 import search_rollout
    from verl.protocol import DataProto
    from verl.workers.rollout.agent_loop import LoopConfig
    from verl.workers.rollout.base import SamplingParams

    width = args.max_tokens * (args.max_turns + 1) + args.max_obs_length * args.max_turns
    loop = LoopConfig(max_turns=args.max_turns, max_start_length=args.max_prompt_length // 2,
                      max_prompt_length=args.max_prompt_length, max_response_length=width, mode=mode,
                      log_probs=False)
    manager = search_rollout(tokenizer, engine, retriever, loop, args.max_obs_length)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=args.seed)
    if proxy:
        proxy.stats(reset=True)
    probe_ms = host_probe_ms()  # the host's speed beside each run (shared, noisy machines)
    counters = engine_counters(engine)
    tic = time.perf_counter()
    out = manager.run(DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts}), params)
    wall = time.perf_counter() - tic
    timing = out.meta_info["timing"]
    generated = int(out.batch["response_mask"].sum())
    busy = timing.get("engine_busy_fraction", timing["generation_s"] / wall)
    result = {"mode": mode, "host_probe_ms": round(probe_ms, 2), "rollout_s": round(wall, 3), "generated_tokens": generated,
              "tokens_per_s": round(generated / wall, 1), "engine_busy_fraction": round(busy, 3),
              "generation_s": round(timing["generation_s"], 3), "retrieval_s": round(timing["tool_s"], 3),
              "mean_turns": round(float(out.batch["turns"].float().mean()), 3),
              "searches": int(out.batch["valid_search"].sum()), "finished": int(out.batch["finished"].sum()),
              "truncated": int(out.batch["truncated"].sum())}
    for key, name in (("mean_tool_calls_in_flight", "mean_searches_in_flight"),
                      ("peak_tool_calls_in_flight", "peak_searches_in_flight"),
                      ("mean_requests_in_engine", "mean_requests_in_engine")):
        if key in timing:
            result[name] = round(timing[key], 2)
    if counters is not None:
        result.update({key: value - counters[key] for key, value in engine_counters(engine).items()})
        result["prefilled_tokens"] = result["prompt_tokens"] - result["prefix_cache_hits"]
    if proxy:
        after = proxy.stats()
        result["proxy_requests"] = after["requests"]
        result["proxy_peak_requests_in_flight"] = after["peak_in_flight"]
    print(json.dumps(result), flush=True)
    return result


def rollout_section(args, servers: dict, work_dir: Path, report: dict) -> None:
    """Run every model of ``--models``; the report is saved after each (a timeout keeps the rest)."""
    from transformers import AutoTokenizer

    from search_r1.search.client import RetrieverClient

    for name in [m for m in args.models.split(",") if m and m != "none"]:
        path = model_path(name, work_dir)
        tokenizer = AutoTokenizer.from_pretrained(path)
        engine = build_engine(path, tokenizer, args)
        if name in RANDOM_SHAPES:
            engine = ForcedTurns(engine, tokenizer, args.max_tokens, args.answer_prob)
        prompts = prompts_for(tokenizer, name, args)
        entry = {"model": name, "rows": len(prompts), "made_by": made_by(args), "runs": {}}
        for retriever_name, server in servers.items():
            client = RetrieverClient(server.retrieve_url, topk=3, max_concurrency=args.max_concurrency)
            proxy = server if retriever_name == "latency" else None
            for mode in ("sync", "async"):  # untimed warm-up of both paths, then the measured runs
                one_rollout(engine, tokenizer, client, prompts[:2 * args.n], mode, args)
            runs = {mode: one_rollout(engine, tokenizer, client, prompts, mode, args, proxy)
                    for mode in ("sync", "async")}
            runs["ratio_sync_over_async"] = round(runs["sync"]["rollout_s"] / runs["async"]["rollout_s"], 3)
            entry["runs"][retriever_name] = runs
        report["rollout"].append(entry)
        save_report(args.report_name, summarize(report), args.out_dir, quiet=True)
        _shutdown(engine.engine if isinstance(engine, ForcedTurns) else engine)
        del engine


def _shutdown(engine) -> None:
    """Stop the vLLM engine so its accelerator memory is free for the next model."""
    import gc

    try:
        engine.llm.llm_engine.engine_core.shutdown()
    except Exception as err:  # noqa: BLE001 - engines without it shut down on garbage collection
        print(f"engine shutdown: {type(err).__name__}: {err}", flush=True)
    del engine
    gc.collect()
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


# ---- whole steps --------------------------------------------------------------------------------
STEP_VARIANTS = {"sync": ("sync", 0, False), "async": ("async", 0, False), "sync_staleness1": ("sync", 1, False),
                 "split_staleness1": ("sync", 1, True)}
"""whole-step runs: name -> (rollout.mode, rollout.staleness, split pools: the engine on a rank of its own)"""

SPLIT_POOLS = ["trainer.backend=ray", "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1"]
"""the overrides that give the engine a GPU of its own (one training GPU, one rollout GPU)"""


STEP_KEYS = ("step", "timing_s/step", "timing_s/gen", "timing_s/tool", "timing_s/ref", "timing_s/old_log_prob",
             "timing_s/update_actor", "timing_s/weight_sync", "timing_s/rollout_wait", "response_length/mean",
             "perf/total_num_tokens")
"""the metrics kept per step: the step's split, and its work (equal work makes the variants' times comparable)"""


def step_overrides(model: str, variant: str, args, log_dir: Path, url: str) -> list[str]:
    """The trainer's overrides of one ``STEP_VARIANTS`` run (staleness 1 with what it needs: the engine
    resident and truncated importance sampling against the rollout's log-probs; on the GPU the
    ``one_step_off_policy`` recipe, whose engine is served from processes of its own), on the
    ``--step_recipe`` recipes if any (e.g. ``learning_gpu``: its micro-batches, learning rate and resident
    engine); the flags' batch, turns and lengths win over the recipes'."""
    from learning_check import grpo_overrides

    mode, staleness, split = STEP_VARIANTS[variant]
    base = grpo_overrides(model, args.step_steps, -1, log_dir, 1e-6, args.step_batch_size, "vllm",
                          n=args.step_n, gpu=args.device == "cuda")
    base += recipe_overrides(*args.step_recipe.split(",")) if args.step_recipe else []
    # the one_step_off_policy recipe on the GPU; on a CPU its engine processes only add start-up time
    lagged = (recipe_overrides("one_step_off_policy") if args.device == "cuda" else
              ["actor_rollout_ref.rollout.free_cache_engine=false", "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0"])
    mine = [f"actor_rollout_ref.rollout.mode={mode}", f"actor_rollout_ref.rollout.staleness={staleness}",
            *(lagged if staleness else []), *(SPLIT_POOLS if split else []), f"retriever.url={url}",
            f"max_turns={args.max_turns}",
            f"data.max_response_length={args.max_tokens}", f"data.max_obs_length={args.max_obs_length}",
            f"data.max_prompt_length={args.max_prompt_length}", "trainer.val_before_train=false",
            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.resume_mode=disable",
            f"trainer.default_local_dir={log_dir / 'ckpt'}", f"retriever.max_concurrency={args.max_concurrency}",
            # the flags' batch wins over a --step_recipe's
            f"data.train_batch_size={args.step_batch_size}", f"actor_rollout_ref.rollout.n={args.step_n}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.step_batch_size}"]
    if args.engine_process:
        mine.append("actor_rollout_ref.rollout.engine_process=true")
    if args.max_num_seqs:
        mine.append(f"actor_rollout_ref.rollout.max_num_seqs={args.max_num_seqs}")
    merged = dict(o.split("=", 1) for o in base + mine)  # a key's last value wins
    return [f"{key}={value}" for key, value in merged.items()]


def made_by(args) -> dict:
    """Where a section's figures came from: a merged report (``--merge_from``) holds sections of
    several runs, each with its own commit, date, GPU (None on the CPU) and engine settings."""
    meta = run_metadata()
    return {"commit": meta["commit"], "date": time.strftime("%Y-%m-%d"), "gpu": (meta["gpu"] or {}).get("name"),
            **{k: getattr(args, k) for k in ENGINE_SETTINGS}}


ENGINE_SETTINGS = ("engine_process", "max_num_seqs", "gpu_memory_utilization", "num_kv_blocks", "engine_stats")
"""the flags that change how the engine runs, recorded in each section's ``made_by``"""


def step_section(args, proxy, work_dir: Path) -> dict:
    model = model_path(args.step_model, work_dir)
    out = {"model": args.step_model, "recipe": args.step_recipe, "prompts": args.step_batch_size, "n": args.step_n,
           "max_turns": args.max_turns, "max_tokens": args.max_tokens, "steps": args.step_steps,
           "made_by": made_by(args)}
    for variant in step_variants(args):
        log_dir = work_dir / f"step_{variant}"
        cmd = [sys.executable, str(REPO / "scripts" / "quickstart.py"), "--data-dir", "data/async_rollout_bench",
               "--train-sources", "hotpotqa", "--test-sources", "hotpotqa", "--retriever-url", proxy.retrieve_url,
               *step_overrides(model, variant, args, log_dir, proxy.retrieve_url)]
        print("+ " + shlex.join(cmd), flush=True)
        probe = host_probe_ms()
        subprocess.run(cmd, cwd=REPO, check=True)
        rows = [json.loads(line) for line in open(log_dir / "metrics.jsonl") if line.strip()]
        later = rows[1:] or rows
        out[variant] = {"step_s": round(sum(r["timing_s/step"] for r in later) / len(later), 2),
                        "step_s_range": [round(f(r["timing_s/step"] for r in later), 2) for f in (min, max)],
                        "gen_s": round(sum(r["timing_s/gen"] for r in later) / len(later), 2), "host_probe_ms": probe,
                        "per_step": [{k: r[k] for k in STEP_KEYS if k in r} for r in rows]}
    for key, (slow, fast) in STEP_RATIOS.items():
        if slow in out and fast in out:
            out[key] = round(out[slow]["step_s"] / out[fast]["step_s"], 3)
    return out


STEP_RATIOS = {"ratio_sync_over_async": ("sync", "async"), "ratio_staleness0_over_1": ("sync", "sync_staleness1"),
               "ratio_staleness0_over_split": ("sync", "split_staleness1"),
               "ratio_colocated_over_split": ("sync_staleness1", "split_staleness1")}
"""the step section's ratios: name -> (the variant whose step time is divided, the one dividing it)"""


def step_variants(args) -> list[str]:
    """The ``--step_variants`` to run, in order.

    Raises:
        SystemExit: an unknown name (argparse's error, naming it).
    """
    names = [name for name in args.step_variants.split(",") if name]
    unknown = [name for name in names if name not in STEP_VARIANTS]
    if unknown or not names:
        raise SystemExit(f"--step_variants {args.step_variants!r}: unknown {unknown}; choose from {list(STEP_VARIANTS)}")
    return names


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine after CUDA init (no fork)
    from search_r1.search.launcher import launch_server
    from search_r1.search.index_builder import build_bm25

    low, high = (float(x) for x in args.latency_ms.split(","))
    report: dict = {"rollout": [], "step": [], "weights": "warm_start/base: real SmolLM2; qwen*/tiny: random init"}
    if args.merge_from:
        earlier = json.loads(Path(args.merge_from).read_text())
        report.update({k: earlier[k] for k in ("rollout", "step") if k in earlier})
    report["config"] = vars(args)
    with tempfile.TemporaryDirectory(prefix="async_rollout_") as tmp:
        work_dir = Path(tmp)
        corpus = str(REPO / "example" / "corpus.jsonl")
        index = build_bm25(corpus, str(work_dir / "bm25"))
        with launch_server(["--retriever_name", "bm25", "--index_path", index, "--corpus_path", corpus]) as server:
            proxy = launch_proxy(server.url, low, high, seed=args.seed)
            try:
                rollout_section(args, {"local": server, "latency": proxy}, work_dir, report)
                if args.step_model != "none":
                    report["step"].append(step_section(args, proxy, work_dir))
            finally:
                proxy.stop()
    save_report(args.report_name, summarize(report), args.out_dir)
    return report


HEADLINE_MODELS = ("qwen2.5-1.5b", "warm_start")
"""the model whose rollout ratios go to the top of the JSON, first that ran (issue 30: the 1.5B shape)"""


def summarize(report: dict) -> dict:
    """The top-level ratios (sync time / async time) first, then the rest. The rollout ratios come
    from the first of ``HEADLINE_MODELS`` that ran, else from the first model; of a model's entries
    in a merged report, from the newest (the last added). The step ratios come from the newest step
    section without a ``recipe`` (a recipe's steps, e.g. the learning recipe's, are another shape)."""
    head = {}
    rank = {name: i for i, name in enumerate(HEADLINE_MODELS)}
    newest_first = list(reversed(report["rollout"]))
    entries = sorted(newest_first, key=lambda e: rank.get(e["model"], len(rank)))
    if entries:
        head["ratio_rollout_local"] = entries[0]["runs"]["local"]["ratio_sync_over_async"]
        head["ratio_rollout_latency"] = entries[0]["runs"]["latency"]["ratio_sync_over_async"]
        head["ratio_rollout_model"] = entries[0]["model"]
    own_shape = [section for section in report.get("step", []) if not section.get("recipe")]
    for top, key in (("ratio_step_latency", "ratio_sync_over_async"), ("ratio_step_staleness", "ratio_staleness0_over_1"),
                     ("ratio_step_staleness_split", "ratio_staleness0_over_split")):
        if own_shape and key in own_shape[-1]:
            head[top] = own_shape[-1][key]
    return {**head, **{k: v for k, v in report.items() if k not in head}}


if __name__ == "__main__":
    main()
