"""Packed-row length on CPU: one actor forward+backward of a GRPO-sized micro-batch, three layouts.

    python benchmarks/cpu_packing.py [--rows 8] [--prompt_len 260] [--response_len 200] [--reps 1]

SmolLM2-135M-Instruct (real weights, fp32), ``rows`` sequences of a left-padded prompt plus a
response of random length, the log-probs (with entropy) of :func:`forward_log_probs` summed and
back-propagated. Layouts in the same run: padded ``(B, T)`` (the baseline), packed into one row
(``max_packed_row_len=0``) and packed into rows of <= 1024 / 2048 tokens. Inside a packed row sdpa
runs over a dense block-diagonal mask, so the cost grows with the row length squared; the report
gives each layout's seconds and its ratio to padded.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import save_report  # noqa: E402

LAYOUTS = {"padded": (False, 0), "packed_one_row": (True, 0), "packed_rows_1024": (True, 1024),
           "packed_rows_2048": (True, 2048)}


def make_micro(rows: int, prompt_len: int, response_len: int, seed: int = 0) -> dict:
    """Random token ids with left padding in the prompt and right padding in the response."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 49000, (rows, prompt_len + response_len), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(rows):
        left = int(torch.randint(0, prompt_len // 6, (), generator=gen))
        kept = int(torch.randint(response_len * 3 // 4, response_len + 1, (), generator=gen))
        mask[row, :left] = 0
        mask[row, prompt_len + kept:] = 0
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids,
            "responses": ids[:, prompt_len:]}


def time_layout(model, micro: dict, remove_padding: bool, row_len: int, reps: int) -> float:
    """Mean seconds of one forward+backward after one untimed warm-up."""
    from verl.workers.forward import ForwardLayout, forward_log_probs

    layout = ForwardLayout(use_remove_padding=remove_padding, max_packed_row_len=row_len)

    def step():
        log_probs, entropy = forward_log_probs(model, micro, 1.0, layout, calculate_entropy=True)
        (log_probs.sum() + entropy.sum()).backward()

    step()
    start = time.perf_counter()
    for _ in range(reps):
        step()
    return (time.perf_counter() - start) / reps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt_len", type=int, default=260)
    parser.add_argument("--response_len", type=int, default=200)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--out_dir", default=None)
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from verl.utils.model_zoo import smollm2_dir

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32)
    micro = make_micro(args.rows, args.prompt_len, args.response_len)
    seconds = {name: time_layout(model, micro, *layout, args.reps) for name, layout in LAYOUTS.items()}
    report = {"model": "SmolLM2-135M-Instruct (real weights, fp32)", "threads": torch.get_num_threads(),
              "rows": args.rows, "real_tokens": int(micro["attention_mask"].sum()),
              "padded_tokens": micro["input_ids"].numel(), "seconds_fwd_bwd": seconds,
              "ratio_to_padded": {k: round(seconds["padded"] / v, 3) for k, v in seconds.items()}}
    save_report("cpu_packing", report, args.out_dir)


if __name__ == "__main__":
    main()
