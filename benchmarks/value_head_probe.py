"""What a fresh critic's value head does to PPO's first advantages, by token type (CPU, minutes).

    python benchmarks/value_head_probe.py --dump VAL.jsonl [--model DIR] [--rows 48] [--seeds 5] \
        [--out benchmarks/results/value_head_probe.json]

``VAL.jsonl`` (or ``.jsonl.gz``) is a trainer validation dump (``trainer.validation_data_dir``: prompt ``input``, response
``output`` with its ``<information>`` blocks, ``score``); ``--model`` the policy the critic starts from
(default: the SFT warm start of ``scripts/warm_start.py``). For each seed the critic is loaded as the
trainer loads it (``load_value_model``) with ``head_init`` ``random`` and once with ``zero``; for
``--rows`` responses (every n-th row of the dump) the values of the model's own tokens (observation
tokens left out, as the response mask does) are taken, the GAE advantage of PPO's first step with
gamma = lambda = 1 is ``A_t = R - V_t`` (Schulman et al. 2016, eq. 16; ``R`` the row's score),
whitened over all tokens as the trainer does. Reported per token type (the tags ``<think>``,
``<search>``, ``<answer>`` and their closings vs. other text): the values' mean and spread, the mean
whitened advantage and its share > 0. A head that gives a token type its own value in every sample
makes that type's first advantages one-signed whatever the reward, so the first actor updates push
the type up or down as a whole.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))

from common import save_report  # noqa: E402
from gpu_generation import host_probe_ms  # noqa: E402

TAGS = ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>")
OBSERVATION = re.compile(r"<information>.*?</information>", re.S)


def token_kinds(text: str, offsets: list[tuple[int, int]]) -> list[str | None]:
    """Per token of ``text`` (its ``(start, end)`` character offsets): ``"tag"`` inside one of
    ``TAGS``, ``"text"`` elsewhere in the model's own tokens, ``None`` inside an observation."""
    observed = [m.span() for m in OBSERVATION.finditer(text)]
    tags = [m.span() for tag in TAGS for m in re.finditer(re.escape(tag), text)]

    def inside(spans, start):
        return any(s <= start < e for s, e in spans)

    return [None if inside(observed, a) else "tag" if inside(tags, a) else "text" for a, _ in offsets]


def first_step_values(critic, tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Values of the response tokens (observations left out) of ``rows``, their rows' scores and
    kinds: three aligned 1-D sequences over all kept tokens. The value of token t is the head's
    output at the position before it (as ``dp_critic``)."""
    values, scores, kinds = [], [], []
    for row in rows:
        prompt = tokenizer(row["input"], add_special_tokens=False)["input_ids"]
        enc = tokenizer(row["output"], add_special_tokens=False, return_offsets_mapping=True)
        with torch.no_grad():
            out = critic(input_ids=torch.tensor([prompt + enc["input_ids"]])).logits[0, :, 0]
        row_values = out[len(prompt) - 1: len(prompt) - 1 + len(enc["input_ids"])]
        for value, kind in zip(row_values.tolist(), token_kinds(row["output"], enc["offset_mapping"])):
            if kind is not None:
                values.append(value), scores.append(float(row["score"])), kinds.append(kind)
    return torch.tensor(values), torch.tensor(scores), kinds


def by_kind(values: torch.Tensor, scores: torch.Tensor, kinds: list[str]) -> dict:
    """Per token kind: count, values' mean/sd, whitened first-step advantage mean and share > 0."""
    advantages = scores - values
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    out = {}
    for kind in ("tag", "text"):
        sel = torch.tensor([k == kind for k in kinds])
        out[kind] = {"tokens": int(sel.sum()), "value_mean": round(values[sel].mean().item(), 4),
                     "value_sd": round(values[sel].std().item(), 4),
                     "advantage_mean": round(advantages[sel].mean().item(), 4),
                     "advantage_share_positive": round((advantages[sel] > 0).float().mean().item(), 4)}
    out["value_sd_all"] = round(values.std().item(), 4)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", required=True, help="a trainer validation dump (val/<step>.jsonl)")
    parser.add_argument("--model", default=None, help="the critic's starting checkpoint (default: the SFT warm start)")
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "value_head_probe.json"))
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from verl.utils.fsdp_utils import load_value_model

    if args.model is None:
        from warm_start import ensure_warm_start
        args.model = ensure_warm_start()
    with (gzip.open if args.dump.endswith(".gz") else open)(args.dump, "rt") as lines:
        rows = [json.loads(line) for line in lines]
    rows = rows[:: max(1, len(rows) // args.rows)][: args.rows]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    scores = torch.tensor([float(r["score"]) for r in rows])
    report = {"dump": args.dump, "model": args.model, "rows": len(rows),
              "score_mean": round(scores.mean().item(), 4), "score_sd": round(scores.std().item(), 4),
              "random": {}, "host_probe_ms": round(host_probe_ms(), 1)}
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        critic = load_value_model({"path": args.model}, head_init="random").eval()
        report["random"][str(seed)] = by_kind(*first_step_values(critic, tokenizer, rows))
        print(f"random head, seed {seed}: {json.dumps(report['random'][str(seed)])}", flush=True)
    critic = load_value_model({"path": args.model}, head_init="zero").eval()
    report["zero"] = by_kind(*first_step_values(critic, tokenizer, rows))
    print(f"zero head: {json.dumps(report['zero'])}", flush=True)
    save_report(Path(args.out).stem, report, Path(args.out).parent)


if __name__ == "__main__":
    main()
