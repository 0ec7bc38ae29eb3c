"""What each of the rollout's sampling settings costs vLLM's decoding, one setting at a time.

    # H200: the random-init 1.5B shape, as many rows as vLLM runs at once (its 1,024-sequence default)
    python benchmarks/sampling_cost.py --out_dir $OUT
    # CPU smoke shape (2 cores)
    python benchmarks/sampling_cost.py --device cpu --model tiny --batch 32 --prompt_len 32 --new_tokens 32

Why: the rollout engine decodes the 1.5B shape at ~13k tokens/s in our rollouts (docs/benchmarks.md,
"Asynchronous rollout"; "Against veRL and TRL") where the same engine decodes ~47k tokens/s with greedy,
undetokenized requests ("GPU: generation"). The trainer's requests differ in several ways; each variant
below turns on one of them over the ``raw`` baseline (temperature 1, nothing else), and ``rollout`` is the
request the trainer sends with the rollout's log-probs (``VLLMRolloutEngine.to_vllm_params`` of Search-R1's
sampling, with per-request seeds): what it sends when truncated importance sampling reads them (staleness 1)
or ``rollout.calculate_log_probs`` asks; an on-policy step sends ``rollout-logprobs``. Every request has
``ignore_eos`` and the same ``max_tokens``, so each variant decodes
the same number of tokens (a stop string can end a row early: ``generated_tokens`` shows it; a random model
rarely writes one).

``rollout-<setting>`` is the trainer's request with one setting taken out (``rollout-stop``: the stop strings;
``rollout-detokenize``: the stop strings and detokenization, which they need), so that settings that cost more
together than apart show as the difference between ``rollout`` and one of these. ``rollout+logprob_text`` is
the trainer's request answered as vLLM does by default, with the text of each log-prob token decoded, which
the trainer's engine skips (``vllm_rollout.skip_logprob_token_text``).

Variants run round-robin ``--repeats`` times in one engine (the engine of ``verl.workers.rollout``, built as
the trainer builds it). Reported per variant: tokens/s (median, min, max over the repeats) and
``slowdown`` = raw's median tokens/s / the variant's. JSON ``sampling_cost.json`` with the host-speed probe
before each run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import save_report  # noqa: E402
from benchmarks.gpu_generation import host_probe_ms  # noqa: E402
from search_r1.envs.search_r1.parsing import STOP_STRINGS  # noqa: E402

SETTINGS = ("top_p", "seeded", "detokenize", "stop", "logprobs")
"""top_p: nucleus 0.95 (Search-R1's rollout.top_p); seeded: one seed a request (rollout.seed_per_request);
detokenize: incremental detokenization; stop: the stop strings (which need it); logprobs: the sampled token's
log-prob (the trainer's rollout log-probs, asked for only where something reads them)"""
VARIANTS = ("raw", *SETTINGS, "rollout", "rollout+logprob_text", *(f"rollout-{s}" for s in SETTINGS))
"""raw: temperature 1 alone; a setting's name: raw + that setting; rollout: all of them, as the trainer sends
them; rollout+logprob_text: that request with each log-prob token's text (vLLM's default); rollout-<setting>:
the trainer's request without that setting"""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--model", default="qwen2.5-1.5b",
                   help="a shape of benchmarks/shapes.py (random init), tiny (CPU) or smollm2 (the real SmolLM2-135M)")
    p.add_argument("--batch", type=int, default=1024, help="prompts of one generate call")
    p.add_argument("--prompt_len", type=int, default=256, help="random token ids a prompt")
    p.add_argument("--new_tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--gpu_memory_utilization", type=float, default=0.6)
    p.add_argument("--engine_process", action="store_true", help="vLLM's engine core in a process of its own")
    p.add_argument("--out_dir", default=None, help="default benchmarks/results (on the device: $OUT)")
    args = p.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        p.error(f"--variants: unknown {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    return args


def request_params(variant: str, count: int, new_tokens: int):
    """vLLM ``SamplingParams`` of ``variant`` for ``count`` requests (a list when seeded: one seed each)."""
    from vllm import SamplingParams as VSamplingParams

    from verl.workers.rollout.vllm_rollout import LOGPROB_TEXT, per_request_seeds

    if variant == "rollout+logprob_text":
        params = trainer_request(new_tokens)
        params.extra_args = {LOGPROB_TEXT: True}
        return per_request_seeds(params, count, 0)
    if variant.startswith("rollout"):
        return per_request_seeds(trainer_request(new_tokens, without=variant.partition("-")[2]), count, 0)
    extra = {"top_p": {"top_p": 0.95}, "seeded": {"seed": 0}, "detokenize": {"detokenize": True},
             "stop": {"detokenize": True, "stop": list(STOP_STRINGS), "include_stop_str_in_output": True},
             "logprobs": {"logprobs": 0, "flat_logprobs": True}}.get(variant, {})
    params = VSamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True,
                             **{"detokenize": False, **extra})
    return per_request_seeds(params, count, 0)


def trainer_request(new_tokens: int, without: str = ""):
    """The request the trainer's engine sends (``VLLMRolloutEngine.to_vllm_params`` of Search-R1's sampling,
    seeded), every row decoding ``new_tokens``; ``without``: one of ``SETTINGS`` taken out of it."""
    from vllm import SamplingParams as VSamplingParams

    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.vllm_rollout import VLLMRolloutEngine

    ours = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=new_tokens, stop=list(STOP_STRINGS), seed=0)
    params = VLLMRolloutEngine.to_vllm_params(ours)
    params.ignore_eos = True
    if not without:
        return params
    fields = {name: getattr(params, name) for name in ("n", "temperature", "top_p", "top_k", "max_tokens", "stop",
                                                       "include_stop_str_in_output", "seed", "logprobs",
                                                       "flat_logprobs", "detokenize", "ignore_eos")}
    removed = {"top_p": {"top_p": 1.0}, "seeded": {"seed": None}, "logprobs": {"logprobs": None},
               "stop": {"stop": [], "include_stop_str_in_output": False},
               "detokenize": {"stop": [], "include_stop_str_in_output": False, "detokenize": False}}[without]
    return VSamplingParams(**{**fields, **removed})  # built anew: vLLM derives its stop-string buffer at init


def one_run(llm, prompts, variant: str, new_tokens: int) -> dict:
    from vllm.inputs import TokensPrompt

    params = request_params(variant, len(prompts), new_tokens)
    probe = host_probe_ms()
    start = time.perf_counter()
    requests = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for r in requests for o in r.outputs)
    return {"seconds": round(seconds, 3), "generated_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
            "host_probe_ms": probe}


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Per variant: the runs, median/min/max tokens/s and the slowdown against ``raw``'s median."""
    out = {}
    for variant, records in runs.items():
        rates = [r["tokens_per_s"] for r in records]
        out[variant] = {"tokens_per_s": statistics.median(rates), "tokens_per_s_range": [min(rates), max(rates)],
                        "runs": records}
    if "raw" in out:
        for variant in out:
            out[variant]["slowdown"] = round(out["raw"]["tokens_per_s"] / out[variant]["tokens_per_s"], 3)
    return out


def build(args, work_dir: Path):
    """The model (random init, real tokenizer) and the trainer's engine over it."""
    from transformers import AutoTokenizer

    from benchmarks.save_random_model import build_tiny_causal_lm, save_random_model
    from verl.utils.model_zoo import qwen_tokenizer_dir
    from verl.workers.rollout import build_rollout_engine

    if args.model == "tiny":
        path = build_tiny_causal_lm(work_dir / "tiny", arch="qwen2")
    elif args.model == "smollm2":  # the real SmolLM2-135M (the embedded CPU recipes' policy, 49,152 ids)
        from verl.utils.model_zoo import smollm2_dir
        path = smollm2_dir()
    else:
        path = save_random_model(args.model, qwen_tokenizer_dir(), str(work_dir / args.model))
    gpu = args.device == "cuda"
    config = {"name": "vllm", "dtype": "bfloat16" if gpu else "float32", "kv_cache_space_gib": 2,
              "gpu_memory_utilization": args.gpu_memory_utilization, "engine_process": args.engine_process}
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = build_rollout_engine(config, path, tokenizer, max_model_len=args.prompt_len + args.new_tokens)
    return engine, len(tokenizer)


def main(argv=None) -> dict:
    import random

    args = parse_args(argv)
    variants = args.variants.split(",")
    with tempfile.TemporaryDirectory(prefix="sampling_cost_") as tmp:
        engine, vocab = build(args, Path(tmp))
        rng = random.Random(0)  # ids below 1,000: ordinary tokens of the Qwen vocabulary, no special ones
        prompts = [[rng.randrange(1000) for _ in range(args.prompt_len)] for _ in range(args.batch)]
        one_run(engine.llm, prompts[:8], "rollout", 8)  # untimed warm-up (CUDA graphs, first requests)
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for _ in range(args.repeats):
            for variant in variants:
                runs[variant].append(one_run(engine.llm, prompts, variant, args.new_tokens))
                print(variant, runs[variant][-1], flush=True)
        engine.shutdown()
    report = {"config": {**vars(args), "vocab": vocab, "stop": list(STOP_STRINGS)}, "variants": summarize(runs)}
    save_report("sampling_cost", report, args.out_dir)
    return report


if __name__ == "__main__":
    main()
