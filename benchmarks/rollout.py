"""Multi-turn search rollout throughput: vLLM engine vs transformers engine, same run, same data.

    flock /tmp/heavy.lock python benchmarks/rollout.py [--batch_size 32] [--max_turns 2]

SmolLM2-135M-Instruct on CPU against a real BM25 retrieval server (example corpus) on 127.0.0.1.
Questions come from example/qa/nq/test.jsonl; every prompt opens the assistant turn with
``<think>...</think>\\n<search>`` so each row searches at least once. Reports generated tokens per
second of the whole rollout and the time split generation / retrieval / bookkeeping, and the
vLLM/transformers ratio. One untimed warm-up rollout per engine comes first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import save_report  # noqa: E402

PREFIX = "<think>I need to look this up.</think>\n<search>"


def questions(n: int) -> list[str]:
    rows = [json.loads(line) for line in open(REPO / "example/qa/nq/test.jsonl")]
    return [rows[i % len(rows)]["question"] for i in range(n)]


def run_engine(name, engine, tokenizer, retriever, prompts, args) -> dict:
    from search_r1.envs.search_r1 import search_rollout
    from verl.protocol import DataProto
    from verl.workers.rollout.agent_loop import LoopConfig
    from verl.workers.rollout.base import SamplingParams

    loop = LoopConfig(max_turns=args.max_turns, max_start_length=1024, max_prompt_length=1536,
                      max_response_length=1024, mode="sync", log_probs=False)
    manager = search_rollout(tokenizer, engine, retriever, loop, args.max_obs_length)
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=0)
    batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts})
    manager.run(DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts[:2]}), params)  # warm-up
    tic = time.perf_counter()
    out = manager.run(batch, params)
    total = time.perf_counter() - tic
    generated = int(out.batch["response_mask"].sum())
    timing = out.meta_info["timing"]
    result = {"engine": name, "total_s": round(total, 2), "generated_tokens": generated,
              "tokens_per_s": round(generated / total, 2),
              "generation_tokens_per_s": round(generated / timing["generation_s"], 2),
              **{k: round(v, 3) for k, v in timing.items()},
              "mean_turns": float(out.batch["turns"].float().mean()),
              "valid_searches": int(out.batch["valid_search"].sum()),
              "finished": int(out.batch["finished"].sum())}
    print(json.dumps(result), flush=True)
    return result


def time_weight_push(engine, model_path: str) -> dict:
    """Seconds to push a full state dict into the running vLLM engine, and the route that worked."""
    from safetensors.torch import load_file

    state = load_file(os.path.join(model_path, "model.safetensors"))
    tic = time.perf_counter()
    engine.update_weights(state.items())
    first = time.perf_counter() - tic
    tic = time.perf_counter()
    engine.update_weights(state.items())
    return {"route": engine.weight_route, "first_push_s": round(first, 3),
            "push_s": round(time.perf_counter() - tic, 3)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_turns", type=int, default=2)
    p.add_argument("--max_tokens", type=int, default=96, help="new tokens per turn")
    p.add_argument("--max_obs_length", type=int, default=256)
    args = p.parse_args()

    from transformers import AutoTokenizer

    from search_r1.search.client import RetrieverClient
    from search_r1.search.launcher import launch_server
    from search_r1.envs.search_r1.prompts import prompt_messages
    from search_r1.search.index_builder import build_bm25
    from verl.utils.model_zoo import smollm2_dir
    from verl.workers.rollout import build_rollout_engine

    model = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(prompt_messages(q), tokenize=False,
                                                              add_generation_prompt=True) + PREFIX,
                                add_special_tokens=False) for q in questions(args.batch_size)]
    corpus = str(REPO / "example/corpus.jsonl")
    index_dir = build_bm25(corpus, tempfile.mkdtemp(prefix="bench_bm25_"))
    with launch_server(["--retriever_name", "bm25", "--index_path", index_dir, "--corpus_path", corpus]) as server:
        retriever = RetrieverClient(server.retrieve_url, topk=3)
        results = []
        for name in ("vllm", "hf"):
            options = {"max_batch_size": args.batch_size} if name == "hf" else {}
            engine = build_rollout_engine({"name": name, "dtype": "float32", "max_model_len": 2048}, model, tokenizer,
                                          **options)
            results.append(run_engine(name, engine, tokenizer, retriever, prompts, args))
            if name == "vllm":
                weight_sync = time_weight_push(engine, model)
            del engine
    by_name = {r["engine"]: r for r in results}
    report = {"config": vars(args), "model": "SmolLM2-135M-Instruct (fp32, CPU)", "retriever": "bm25 example corpus",
              "results": results, "vllm_weight_sync": weight_sync,
              "vllm_over_hf_tokens_per_s": round(by_name["vllm"]["tokens_per_s"] / by_name["hf"]["tokens_per_s"], 3),
              "vllm_over_hf_generation_tokens_per_s": round(
                  by_name["vllm"]["generation_tokens_per_s"] / by_name["hf"]["generation_tokens_per_s"], 3)}
    save_report("rollout", report)


if __name__ == "__main__":
    main()
