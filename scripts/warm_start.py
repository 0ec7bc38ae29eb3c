"""Format warm start for the embedded default model (SmolLM2-135M-Instruct), cached once.

SmolLM2 prompted with the Search-R1 template almost never closes an ``<answer>`` tag, so every GRPO
group has zero reward spread. A short SFT on search-then-answer demonstrations
(``scripts/make_sft_data.py``) teaches the tag format; RL then has signal. The result is cached under
``<cache_root>/warm_start/<name>/`` (``~/.cache/search_r1`` or ``$SEARCH_R1_CACHE``) and reused.

    python scripts/warm_start.py                 # build if missing, print the HF folder (labelled)
    python scripts/warm_start.py --evaluate 24   # + greedy answer-tag rate and EM on test questions
    python scripts/warm_start.py --evaluate 24 --eval_base   # ... and the base model too
    python scripts/warm_start.py --output DIR    # also link DIR/huggingface -> the cached folder
    python scripts/warm_start.py --multi_hop_searches 2   # the variant whose multi-hop demos search twice

``--multi_hop_searches 2`` builds a separately cached variant (``<name>-2hop``) from a 50/50 mix of
two-search multi-hop and one-search single-hop demonstrations (``make_sft_data.py``'s docstring): after
RL from the default warm start the model searches exactly once per question on every source.

From Python (the quickstart): ``from warm_start import ensure_warm_start; path = ensure_warm_start()``
(``ensure_warm_start(multi_hop_searches=2)`` for the variant).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "scripts")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from verl.trainer.run_exit import run_or_exit  # noqa: E402
from verl.utils.signals import run_child, stopped_by_signal  # noqa: E402

WARM_START_NAME = "smollm2-135m-search-sft-v2"  # bump when the recipe below changes
# Sized for 2 shared CPU cores: 40 demonstrations whose observations are exactly what the embedded
# RL default shows (retriever topk 3, cut to data.max_obs_length=128 tokens by the generation
# manager's ObservationEncoder), each with a second think that states the answer found; 20 steps at
# lr 3e-4 (2 epochs of 40 demos, batch 4, ~375 tokens each). The recipes tried and their measured
# effect are in docs/sft.md.
NUM_DEMOS, NUM_VAL, DEMO_TOPK, DEMO_MAX_OBS_LENGTH = 40, 4, 3, 128
SFT_OVERRIDES = [
    "data.max_length=1024", "data.truncation=drop", "data.train_batch_size=4", "data.use_dynamic_bsz=true",
    "data.max_token_len_per_gpu=4096", "model.enable_gradient_checkpointing=false",
    "optim.lr=3e-4", "optim.warmup_steps_ratio=0.0", "optim.lr_scheduler=cosine", "optim.min_lr_ratio=0.1",
    "trainer.total_epochs=2", "trainer.save_optimizer=false", "trainer.logger=[console]",
    "trainer.experiment_name=warm_start",
]


def warm_start_name(multi_hop_searches: int = 1) -> str:
    """The cache name of the recipe: ``WARM_START_NAME``, with ``-2hop`` for two-search multi-hop demos."""
    return WARM_START_NAME if multi_hop_searches == 1 else f"{WARM_START_NAME}-{multi_hop_searches}hop"


def warm_start_dir(multi_hop_searches: int = 1) -> Path:
    """The cached HF folder of the warm start (``multi_hop_searches``: see :func:`ensure_warm_start`)."""
    from verl.utils.model_zoo import cache_root

    return cache_root() / "warm_start" / warm_start_name(multi_hop_searches)


def ensure_warm_start(force: bool = False, num_demos: int = NUM_DEMOS, multi_hop_searches: int = 1) -> str:
    """Path of the warm-started HF folder, running data generation + SFT when it is not cached.

    ``multi_hop_searches=2`` is the variant whose multi-hop demonstrations search twice (half of the
    demos; the single-hop half searches once), cached under its own name.

    Raises:
        subprocess.CalledProcessError: the SFT run failed (its output is shown).
    """
    target = warm_start_dir(multi_hop_searches)
    if (target / "config.json").exists() and not force:
        print(f"warm start: cached at {target}")
        return str(target)
    from make_sft_data import main as make_sft_data

    from verl.utils.model_zoo import smollm2_dir

    base = smollm2_dir()
    with tempfile.TemporaryDirectory(prefix="warm_start_") as work:
        data_started = time.perf_counter()
        data = make_sft_data(["--output_dir", f"{work}/data", "--num_demos", str(num_demos),
                              "--num_val", str(NUM_VAL), "--topk", str(DEMO_TOPK),
                              "--tokenizer", base, "--max_obs_length", str(DEMO_MAX_OBS_LENGTH),
                              "--multi_hop_searches", str(multi_hop_searches)])
        started = time.perf_counter()
        data_seconds = round(started - data_started, 1)
        command = [sys.executable, "-m", "verl.trainer.fsdp_sft_trainer", f"model.path={base}",
                   f"data.train_files={work}/data/train.jsonl", f"data.val_files={work}/data/val.jsonl",
                   f"trainer.default_local_dir={work}/ckpt", *SFT_OVERRIDES]
        print("warm start: " + " ".join(command), flush=True)
        returncode = run_child(command, cwd=ROOT)  # a SIGINT/SIGTERM stops the SFT step, which says so
        if stopped_by_signal(returncode):
            raise SystemExit(returncode if returncode > 0 else 128 - returncode)  # the temporary folder goes
        if returncode:
            raise subprocess.CalledProcessError(returncode, command)
        exported = sorted(Path(work, "ckpt").glob("global_step_*/huggingface"))[-1]
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(exported, tmp)
        (tmp / "warm_start.json").write_text(json.dumps(
            {"base": base, "sft_overrides": SFT_OVERRIDES, "data": data, "data_seconds": data_seconds,
             "sft_seconds": round(time.perf_counter() - started, 1)}, indent=1))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    print(f"warm start: saved to {target} (demonstrations {data_seconds:.0f} s, "
          f"SFT process {time.perf_counter() - started:.0f} s)")
    return str(target)


def test_questions(qa_dir: Path, limit: int) -> list[dict]:
    """Up to ``limit`` held-out questions, round-robin over the test/dev files (never train)."""
    from make_sft_data import is_train_file, read_jsonl

    files = [p for p in sorted(qa_dir.rglob("*.jsonl")) if not is_train_file(p)]
    pools = [[dict(r, data_source=p.parent.name) for r in read_jsonl(p)] for p in files]
    rows = []
    for i in range(max(map(len, pools), default=0)):
        rows.extend(pool[i] for pool in pools if i < len(pool))
    return rows[:limit]


def evaluate(model_path: str, num_questions: int = 60, qa_dir: str | None = None,
             corpus: str | None = None, max_turns: int = 2) -> dict:
    """Greedy multi-turn rollouts with search (the RL agent loop) on held-out questions.

    Returns:
        ``answer_closed`` (fraction of responses with a closed ``<answer>``), ``em`` (exact match),
        ``searches_per_question`` (mean, and ``searches_by_kind`` for multi-hop and single-hop sources),
        ``response_tokens`` (mean), ``num_questions``.
    """
    import numpy as np
    from transformers import AutoTokenizer

    from make_sft_data import MULTI_HOP_SOURCES, make_retriever
    from search_r1.envs.search_r1 import search_rollout
    from search_r1.envs.search_r1.prompts import make_prefix
    from search_r1.envs.search_r1.reward import compute_score_em
    from verl.protocol import DataProto
    from verl.workers.rollout.agent_loop import LoopConfig
    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRolloutEngine

    rows = test_questions(Path(qa_dir or ROOT / "example" / "qa"), num_questions)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": make_prefix(r["question"])}],
                                             add_generation_prompt=True, tokenize=False) for r in rows]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": np.array(prompt_ids + [None], dtype=object)[:-1]})
    rollout = search_rollout(
        tokenizer, HFRolloutEngine(tokenizer, model_path=model_path, max_batch_size=16),
        make_retriever(corpus or str(ROOT / "example" / "corpus.jsonl"), 3, None),
        LoopConfig(max_turns=max_turns, max_start_length=2048, max_prompt_length=4096, max_response_length=600,
                   mode="sync", log_probs=False), DEMO_MAX_OBS_LENGTH)
    out = rollout.run(batch, SamplingParams(temperature=0.0, max_tokens=200))
    texts = [tokenizer.decode(ids[: int(n)]) for ids, n in
             zip(out.batch["responses"], out.batch["attention_mask"][:, -out.batch["responses"].shape[1]:].sum(-1))]
    targets = [{"target": r["golden_answers"]} for r in rows]
    em = [compute_score_em(t, g) for t, g in zip(texts, targets)]
    closed = ["<answer>" in t and "</answer>" in t for t in texts]
    searches = out.batch["valid_search"].float().numpy()
    multi_hop = np.array([r["data_source"] in MULTI_HOP_SOURCES for r in rows])
    kinds = {"multi_hop": multi_hop, "single_hop": ~multi_hop}
    return {"num_questions": len(rows), "answer_closed": float(np.mean(closed)), "em": float(np.mean(em)),
            "searches_per_question": float(searches.mean()),
            "searches_by_kind": {kind: {"questions": int(mask.sum()), "searches": float(searches[mask].mean())}
                                 for kind, mask in kinds.items() if mask.any()},
            "response_tokens": float(out.batch["attention_mask"][:, -out.batch["responses"].shape[1]:].sum(-1).float().mean()),
            "examples": texts[:3]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="SFT warm start for SmolLM2 (cached)")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--num_demos", type=int, default=NUM_DEMOS)
    parser.add_argument("--multi_hop_searches", type=int, choices=(1, 2), default=1,
                        help="2: the variant whose multi-hop demos search twice (cached as <name>-2hop)")
    parser.add_argument("--evaluate", type=int, default=0, metavar="N",
                        help="also evaluate the warm start greedily on N held-out questions")
    parser.add_argument("--eval_base", action="store_true", help="with --evaluate, also evaluate the base model")
    parser.add_argument("--max_turns", type=int, default=2, help="turns per evaluation rollout")
    parser.add_argument("--output", default=None,
                        help="also expose the cached folder as OUTPUT/huggingface (a symlink; the quickstart's hook)")
    parser.add_argument("--eval_out", default=None, help="write the evaluation JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    path = ensure_warm_start(force=args.force, num_demos=args.num_demos, multi_hop_searches=args.multi_hop_searches)
    if args.output:
        link = Path(args.output) / "huggingface"
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(path, target_is_directory=True)
        print(f"warm start: RL starts from {link} (-> {path})")
        path = str(link)
    else:
        print(f"warm start: HF folder {path}")
    if args.evaluate:
        from verl.utils.model_zoo import smollm2_dir

        models = ([("base", smollm2_dir())] if args.eval_base else []) + [("warm_start", path)]
        started = time.perf_counter()
        report = {name: evaluate(p, args.evaluate, max_turns=args.max_turns) for name, p in models}
        report["eval_seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps(report, indent=1))
        if args.eval_out:
            Path(args.eval_out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    run_or_exit(main)
