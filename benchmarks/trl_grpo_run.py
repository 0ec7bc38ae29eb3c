"""TRL's GRPOTrainer on the vs_trl configuration; writes per-step timings as JSON.

Run by benchmarks/vs_trl.py in a child process (so its peak memory is measured alone):

    python benchmarks/trl_grpo_run.py --questions Q.jsonl --model DIR --steps 5 --out T.json

Configuration (issue 9): SmolLM2-135M-Instruct, fp32 on CPU, 8 prompts x 4 generations, at most 128
new tokens, temperature 1.0, lr 1e-6, KL coefficient 0.001 with a reference model, 4 micro-batches
of 8 (32 completions per optimizer step), transformers generation. The reward is the same
single-turn EM score ours uses: 1 for an exact match in the last <answer>, 0.1 for a well-formed but
wrong answer, 0 without one.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from search_r1.envs.search_r1.reward import compute_score_em


def em_reward(completions, target, **_):
    """TRL reward function: EM with a 0.1 format bonus, on the completion text only."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(compute_score_em(t, {"target": list(g)}, format_score=0.1)) for t, g in zip(texts, target)]


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step, and the generation share measured inside it."""

    def __init__(self):
        self.steps, self._t0 = [], None

    def on_step_begin(self, args, state, control, **kw):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.steps.append({"step_s": time.perf_counter() - self._t0})


class TimedGRPOTrainer(GRPOTrainer):
    """Records generation time, and generation + scoring (reward, old/ref log-probs), per step."""

    def _generate(self, *args, **kwargs):
        start = time.perf_counter()
        out = super()._generate(*args, **kwargs)
        self.gen_times.append(time.perf_counter() - start)
        return out

    def _generate_and_score_completions(self, inputs):
        start = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        self.score_times.append(time.perf_counter() - start)
        self.gen_tokens.append(int(out["completion_mask"].sum()))
        return out


def load_dataset(path: str) -> Dataset:
    rows = [json.loads(line) for line in open(path)]
    return Dataset.from_list([{"prompt": r["prompt"], "target": r["target"]} for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--questions", required=True, help="JSONL rows {prompt: [messages], target: [answers]}")
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = GRPOConfig(
        output_dir="/tmp/trl_grpo_bench", use_cpu=True, bf16=False, report_to=[], save_strategy="no",
        max_steps=args.steps, logging_steps=1, learning_rate=1e-6, beta=0.001,
        num_generations=4, max_completion_length=128, temperature=1.0,
        per_device_train_batch_size=8, gradient_accumulation_steps=4, seed=0,
        dataloader_num_workers=0)
    timer = StepTimer()
    trainer = TimedGRPOTrainer(model=model, reward_funcs=em_reward, args=config,
                               train_dataset=load_dataset(args.questions), processing_class=tokenizer,
                               callbacks=[timer])
    trainer.gen_times, trainer.score_times, trainer.gen_tokens = [], [], []
    trainer.train()
    for step, gen_s, score_s, tokens in zip(timer.steps, trainer.gen_times, trainer.score_times,
                                            trainer.gen_tokens):
        # score_s = generation + reward + old/ref log-probs; the rest of the step is the update.
        step.update(gen_s=gen_s, log_prob_s=score_s - gen_s, update_s=step["step_s"] - score_s,
                    generated_tokens=tokens)
    json.dump({"steps": timer.steps}, open(args.out, "w"), indent=2)


if __name__ == "__main__":
    main()
