"""TRL 1.16's GRPOTrainer on one GPU with vLLM colocated, timed per optimizer step (issue 27).

Run by ``benchmarks/vs_peers_gpu.py`` in a child process whose ``PYTHONPATH`` puts TRL's own site
first (``/tmp/site-trl:/tmp/site``); it imports nothing of ours (the reward is ``em_reward.py`` beside it):

    python benchmarks/peers/trl_gpu_run.py --questions Q.jsonl --model DIR --steps 5 --out T.json \
        --prompts 64 --generations 8 --max_prompt_length 320 --max_completion_length 320 --lr 2e-5 \
        --micro_batch 64 --vllm_gpu_memory_utilization 0.3 --stop '</search>' '</answer>' [--gradient_checkpointing]

One optimizer step = ``prompts x generations`` completions generated at once by the colocated vLLM
engine (``generation_batch_size``), then ``gradient_accumulation_steps`` micro-batches of
``micro_batch`` completions; a completion ends at the EOS, ``--stop`` (vLLM stop strings, kept in the
completion: TRL's ``generation_kwargs``) or the length limit; KL 0.001 against a reference model; fp32 weights and AdamW state with
bf16 autocast (``bf16=True``), as ours and veRL keep fp32 masters. Writes ``{"steps": [...]}``
with per step (seconds): ``step_s``, ``gen_s`` (vLLM generation), ``weight_sync_s`` (the actor's
weights into vLLM, TRL's ``sync_weights``), ``log_prob_s`` (reward, old and reference log-probs:
``_generate_and_score_completions`` less generation and sync), ``update_s`` (the rest of the step),
``generated_tokens``, ``total_tokens`` (prompt + completion tokens, no padding) and
``max_memory_allocated_gib`` / ``max_memory_reserved_gib`` (this process's torch allocator, vLLM's pool included).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from em_reward import em_reward  # noqa: E402


def grpo_config(args: argparse.Namespace):
    """TRL's ``GRPOConfig`` for the run: vLLM colocated, bf16, one GPU; what the docstring lists."""
    from trl import GRPOConfig

    completions = args.prompts * args.generations
    if completions % args.micro_batch:
        raise ValueError(f"--micro_batch {args.micro_batch} does not divide {completions} completions a step")
    return GRPOConfig(
        output_dir=args.output_dir, bf16=True, report_to=[], save_strategy="no", max_steps=args.steps,
        logging_steps=1, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, beta=args.beta,
        num_generations=args.generations, max_completion_length=args.max_completion_length,
        temperature=args.temperature, top_p=args.top_p, per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=completions // args.micro_batch, generation_batch_size=completions,
        gradient_checkpointing=args.gradient_checkpointing, use_vllm=True, vllm_mode="colocate",
        vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        vllm_max_model_length=args.max_prompt_length + args.max_completion_length, seed=0,
        dataloader_num_workers=0,
        generation_kwargs={"stop": args.stop, "include_stop_str_in_output": True} if args.stop else None)


def timed_trainer_class():
    """``GRPOTrainer`` recording, per generation batch, generation and scoring times and token counts."""
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate(self, *args, **kwargs):
            started = time.perf_counter()
            out = super()._generate(*args, **kwargs)
            self.bench["gen_s"].append(time.perf_counter() - started)
            return out

        def _generate_and_score_completions(self, inputs):
            started = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            self.bench["score_s"].append(time.perf_counter() - started)
            completion = int(out["completion_mask"].sum())
            self.bench["generated_tokens"].append(completion)
            self.bench["total_tokens"].append(completion + int(out["prompt_mask"].sum()))
            return out

    return TimedGRPOTrainer


def time_weight_sync(trainer) -> None:
    """Wrap the trainer's vLLM weight push so that each call's seconds land in ``bench["sync_s"]``."""
    vllm_generation, push = trainer.vllm_generation, trainer.vllm_generation.sync_weights

    def timed():
        started = time.perf_counter()
        push()
        trainer.bench["sync_s"].append(time.perf_counter() - started)

    vllm_generation.sync_weights = timed


def step_callback():
    """A ``TrainerCallback`` keeping each optimizer step's wall time and the peak GPU memory after it."""
    import torch
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.steps, self._started = [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            torch.cuda.synchronize()
            self._started = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            torch.cuda.synchronize()
            self.steps.append({"step_s": time.perf_counter() - self._started,
                               "max_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                               "max_memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30})

    return StepTimer()


def step_records(steps: list[dict], bench: dict) -> list[dict]:
    """Per-step records: the callback's times joined with the trainer's per-generation ones.

    The first step's weight push does not happen (vLLM starts with the model's weights), so pushes are
    matched to the steps from the end.
    """
    syncs = [0.0] * (len(steps) - len(bench["sync_s"])) + bench["sync_s"]
    out = []
    for step, gen_s, score_s, sync_s, generated, total in zip(steps, bench["gen_s"], bench["score_s"], syncs,
                                                              bench["generated_tokens"], bench["total_tokens"]):
        out.append({**step, "gen_s": gen_s - sync_s, "weight_sync_s": sync_s, "log_prob_s": score_s - gen_s,
                    "update_s": step["step_s"] - score_s, "generated_tokens": generated, "total_tokens": total})
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", required=True, help="JSONL rows {prompt: [messages], target: [answers]}")
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--output_dir", default="/tmp/trl_gpu_run", help="TRL's own output folder (nothing saved)")
    ap.add_argument("--prompts", type=int, default=64, help="prompts a step")
    ap.add_argument("--generations", type=int, default=8, help="completions a prompt")
    ap.add_argument("--max_prompt_length", type=int, default=320, help="tokens; sizes vLLM's context")
    ap.add_argument("--max_completion_length", type=int, default=320, help="new tokens a completion")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--beta", type=float, default=0.001, help="KL coefficient (reference model)")
    ap.add_argument("--micro_batch", type=int, default=64, help="completions a forward/backward pass")
    ap.add_argument("--vllm_gpu_memory_utilization", type=float, default=0.3, help="fraction of the GPU for vLLM")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top_p", type=float, default=1.0, help="nucleus mass (1.0: the whole vocabulary)")
    ap.add_argument("--stop", nargs="*", default=[], help="strings that end a completion (kept in it)")
    ap.add_argument("--gradient_checkpointing", action="store_true", help="TRL's default; off unless given")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    rows = [json.loads(line) for line in open(args.questions)]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "target": r["target"]} for r in rows])
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    timer = step_callback()
    trainer = timed_trainer_class()(model=model, reward_funcs=em_reward, args=grpo_config(args),
                                    train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(args.model),
                                    callbacks=[timer])
    trainer.bench = {"gen_s": [], "score_s": [], "sync_s": [], "generated_tokens": [], "total_tokens": []}
    time_weight_sync(trainer)
    trainer.train()
    Path(args.out).write_text(json.dumps({"steps": step_records(timer.steps, trainer.bench)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
