"""Inputs of the paper-length training runs (issue 21, part 2): a random model that searches, and data
whose prompts open a search.

A randomly initialised policy samples almost uniformly over its 151,936 ids, so it never writes the
stop string ``</search>``: every turn runs to its token limit and ends the trajectory, and no
multi-turn context ever forms, forced ``<search>`` prefix or not. ``model`` therefore

1. adds ``<search>`` and ``</search>`` to the (borrowed) tokenizer as single tokens and drops its chat
   template (prompts are raw text, as for Search-R1's base-model runs), and
2. biases the random weights so that, in the turns that follow the data's prompts, ``</search>`` is
   sampled with probability ~``1/close_every`` and ``<search>`` with ~twice that: one embedding
   coordinate is set to a large constant for every token (so the final hidden state points along it
   at every position) and raised further for the two tokens. With tied embeddings that raises exactly
   those two logits, by the same amount wherever the turn is. The offsets are solved in closed form
   from the final hidden states of real prompts followed by uniformly drawn ids (:class:`TurnLogits`),
   then checked by a forward pass.

Turns then end after ~``close_every`` tokens with a ``</search>``; the first turn, opened by the
forced prefix, is a valid search, later ones are valid when ``<search>`` came first (~2/3), else
they get the corrective message; either way the row continues, so contexts grow by an observation
per turn (500 tokens at the paper's ``max_obs_length``) up to ``max_turns``. Throughput does not
depend on the weight values; the bias only shapes where turns end.

    python benchmarks/paper_scale_prep.py data --src data/example_search --out /tmp/paper_data
    python benchmarks/paper_scale_prep.py model --src /tmp/q3b --out /tmp/q3b-search --data /tmp/paper_data/train.parquet
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PREFIX = "<think>I need to look this up.</think>\n<search>"
OPEN, CLOSE = "<search>", "</search>"
BIAS_COORD = 0  # the embedding coordinate carrying the bias
# That coordinate for every token is a multiple of the norm of everything else in the final residual
# stream (:func:`base_value`; the layers see normalized inputs, so that norm does not move with it): the
# final hidden state then points along the coordinate at every position, whatever the context, and the
# bias is the same everywhere. A coordinate small against that norm lets the layers' own writes to it,
# which vary with the context, decide how much bias reaches the logits, and lets the special tokens' own
# positions, where their rows dominate, predict them at once.
BASE_MARGIN = 4.0
MAX_OFFSET_BASES = 64  # the largest offset tried for the two tokens, in units of the base value


def turn_inputs(prompts: list[list[int]], vocab: int, exclude: Sequence[int], seq_len: int,
                seed: int = 0) -> tuple["torch.Tensor", int]:
    """The contexts turns are generated in: each prompt (cut on the left to the shortest one's
    length, the forced prefix kept at its end) followed by ``seq_len`` ids drawn uniformly from the vocabulary, ``exclude``
    left out (a random policy samples almost uniformly). Returns ``(input_ids (B, P + seq_len), P)``:
    the next-token predictions of the turn are those at positions ``P - 1 .. P + seq_len - 2``.
    """
    import torch

    length = min(len(p) for p in prompts)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for prompt in prompts:
        turn = torch.randint(0, vocab - len(exclude), (seq_len,), generator=gen)
        for token in sorted(exclude):  # shift past each excluded id: uniform over the rest
            turn += (turn >= token).long()
        rows.append(torch.cat([torch.tensor(prompt[-length:]), turn]))
    return torch.stack(rows), length


class TurnLogits:
    """The two tokens' probabilities at the turn positions of ``inputs`` as closed-form functions of
    their offsets: the final (normed) hidden states ``h`` (N, H) are computed once, and with tied
    embeddings a token's logit is ``h @ W[t]``, whose ``BIAS_COORD`` entry is ``base + offset``.
    The hidden states depend on the offsets only through the prompts' own ``<search>`` (the forced
    prefix): :func:`bias_model` recomputes them after each round.
    """

    def __init__(self, model, inputs, start: int, token_ids: Sequence[int], base: float) -> None:
        import torch

        self.base_value = base
        with torch.inference_mode():
            h = model.base_model(input_ids=inputs).last_hidden_state[:, start - 1:-1].float().flatten(0, 1)
            weight = model.get_output_embeddings().weight.float()
            others = torch.ones(weight.shape[0], dtype=torch.bool, device=weight.device)
            others[list(token_ids)] = False
            self.rest = torch.logsumexp(h @ weight[others].T, dim=-1)  # (N,)
            rows = weight[list(token_ids)].clone()
            rows[:, BIAS_COORD] = 0.0
            self.without_bias = {t: h @ row for t, row in zip(token_ids, rows)}  # (N,) each
        self.h0 = h[:, BIAS_COORD]

    def probabilities(self, offsets: dict[int, float]) -> dict[int, float]:
        """Mean next-token probability of each token over the turn positions, at ``offsets``."""
        import torch

        logits = {t: self.without_bias[t] + self.h0 * (self.base_value + off) for t, off in offsets.items()}
        total = torch.logsumexp(torch.stack([self.rest, *logits.values()]), dim=0)
        return {t: float((logit - total).exp().mean()) for t, logit in logits.items()}


def _solve_offset(probability_of, token: int, target: float, limit: float, iterations: int = 40) -> float:
    """The offset at which ``probability_of(offset)`` (increasing) reaches ``target`` (bisection).

    Raises:
        ValueError: ``target`` is not reached at ``limit``.
    """
    low, high = 0.0, limit / 2 ** 10
    while probability_of(high) < target:
        if high >= limit:
            raise ValueError(f"token {token}: probability {target:.4g} not reached at offset {high}")
        low, high = high, high * 2
    for _ in range(iterations):
        mid = (low + high) / 2
        low, high = (mid, high) if probability_of(mid) < target else (low, mid)
    return (low + high) / 2


def base_value(model, inputs, start: int) -> float:
    """``BASE_MARGIN`` x the largest norm of the final residual stream (the final norm's input) at the
    turn positions of ``inputs``, the bias coordinate left out, rounded up to a power of two (exact in
    bfloat16). The layers see normalized inputs, so that norm does not depend on the coordinate's value."""
    import torch

    seen = []
    hook = model.base_model.norm.register_forward_pre_hook(lambda _, args: seen.append(args[0].detach()))
    try:
        with torch.inference_mode():
            model(input_ids=inputs)
    finally:
        hook.remove()
    rest = seen[0][:, start - 1:-1].float().clone()
    rest[..., BIAS_COORD] = 0.0
    return float(2.0 ** math.ceil(math.log2(BASE_MARGIN * float(rest.norm(dim=-1).max()))))


def turn_statistics(model, inputs, start: int, open_id: int, close_id: int) -> dict:
    """A real forward pass over the turn contexts: each token's mean probability at the turn positions
    and the expected turn length until ``</search>`` (within the ``seq_len`` positions, tokens)."""
    import torch

    with torch.inference_mode():
        probs = model(input_ids=inputs).logits[:, start - 1:-1].float().softmax(-1)
    close = probs[..., close_id]
    survive = torch.cumprod(torch.cat([torch.ones_like(close[:, :1]), 1 - close[:, :-1]], 1), 1)
    return {"open": float(probs[..., open_id].mean()), "close": float(close.mean()),
            "expected_turn_tokens": float(survive.sum(1).mean())}


def bias_model(model, open_id: int, close_id: int, prompts: list[list[int]], close_every: float = 150.0,
               rounds: int = 3, batch: int = 4, seq_len: int = 128) -> dict:
    """Set the embedding bias so that, in the turns of ``prompts``, ``</search>`` has mean probability
    ``1/close_every`` and ``<search>`` twice that.

    The probabilities are measured where turns are generated: after a real prompt (its forced prefix
    included), over ``seq_len`` uniformly drawn ids: real text before the turn changes what reaches the
    logits unless the coordinate dominates (``BASE_MARGIN``). Both offsets are solved together (the
    tokens draw on one coordinate and compete), ``rounds`` times with the hidden states recomputed,
    then checked by a real forward pass.

    Args:
        prompts: token ids of prompts as the trainer renders them (the forced prefix at their end);
            the first ``batch`` are used.
    Returns:
        ``{"open": (offset, probability), "close": (offset, probability), "base_value",
        "target_close_every", "expected_turn_tokens"}`` (the probabilities and turn length of the check).
    Raises:
        ValueError: the embeddings are not tied (the bias needs both), no prompt is given, a
            probability is out of reach, or the check finds ``</search>`` off its target by more
            than 2x.
    """
    import torch

    if model.get_output_embeddings() is not None and \
            model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        raise ValueError("bias_model needs tied input/output embeddings (Qwen2.5-3B ties them)")
    if not prompts:
        raise ValueError("bias_model needs prompts: the turns' probabilities depend on them")
    targets = {open_id: 2.0 / close_every, close_id: 1.0 / close_every}
    weight = model.get_input_embeddings().weight
    device = weight.device
    inputs, start = turn_inputs(prompts[:batch], weight.shape[0], (open_id, close_id), seq_len)
    inputs = inputs.to(device)
    offsets = {open_id: 0.0, close_id: 0.0}
    with torch.no_grad():
        weight[:, BIAS_COORD] = 1.0
        base = base_value(model, inputs, start)
        weight[:, BIAS_COORD] = base
        # The final norm's weight on the coordinate, so that it adds ~1 to every logit, not
        # ~sqrt(hidden) x base: bfloat16 logits keep their resolution (a token's bias is then ~offset / base).
        model.base_model.norm.weight[BIAS_COORD] = 1.0 / (weight.shape[1] ** 0.5 * base)
        for _ in range(rounds):
            for token, offset in offsets.items():
                weight[token, BIAS_COORD] = base + offset
            turn = TurnLogits(model, inputs, start, (open_id, close_id), base)
            for _ in range(4):  # each token solved with the other in place, to a fixed point
                for token, target in targets.items():
                    offsets[token] = _solve_offset(lambda off, t=token: turn.probabilities({**offsets, t: off})[t],
                                                   token, target, MAX_OFFSET_BASES * base)
        for token, offset in offsets.items():
            weight[token, BIAS_COORD] = base + offset
        check = turn_statistics(model, inputs, start, open_id, close_id)
    if not 0.5 <= check["close"] * close_every <= 2.0:
        raise ValueError(f"token {close_id}: probability {check['close']:.4g} in the turns after calibration, "
                         f"target {1 / close_every:.4g}")
    return {"open": (offsets[open_id], check["open"]), "close": (offsets[close_id], check["close"]),
            "base_value": base, "target_close_every": close_every,
            "expected_turn_tokens": check["expected_turn_tokens"]}


def prompt_ids(tokenizer, data: str, limit: int = 64) -> list[list[int]]:
    """Token ids of the first ``limit`` prompts of ``data`` (a parquet file of :func:`make_search_data`),
    rendered as the trainer renders them."""
    import pyarrow.parquet as pq

    from verl.utils.dataset.rl_dataset import as_messages, render_prompt

    rows = pq.read_table(data, columns=["prompt"]).slice(0, limit).to_pylist()
    return [tokenizer(render_prompt(tokenizer, as_messages(row["prompt"], f"{data} row {i}")),
                      add_special_tokens=False).input_ids for i, row in enumerate(rows)]


def make_search_model(src: str, out: str, data: str, close_every: float = 150.0, device: str | None = None) -> dict:
    """Load a random model folder, add the search tokens, bias it in the turns of ``data``'s prompts,
    save to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(src)
    tokenizer.add_tokens([OPEN, CLOSE])
    tokenizer.chat_template = None
    open_id, close_id = tokenizer.convert_tokens_to_ids([OPEN, CLOSE])
    # calibrated in float32 on a CPU, where bfloat16 matmuls are several times slower; saved in bfloat16
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype).to(device)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        raise ValueError(f"{src}: {len(tokenizer)} token ids do not fit the model's embedding")
    samples = {"batch": 16, "seq_len": 256} if device != "cpu" else {}
    info = bias_model(model, open_id, close_id, prompt_ids(tokenizer, data), close_every, **samples)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    config = Path(out) / "tokenizer_config.json"
    data_json = json.loads(config.read_text())
    data_json.pop("chat_template", None)
    config.write_text(json.dumps(data_json, indent=2))
    for name in ("chat_template.jinja", "chat_template.json"):
        if (Path(out) / name).exists():
            os.unlink(Path(out) / name)
    info.update(open_id=open_id, close_id=close_id, decoded=tokenizer.decode([open_id, close_id]))
    (Path(out) / "search_bias.json").write_text(json.dumps(info, indent=2))
    return info


def make_search_data(src: str, out: str, prefix: str = PREFIX) -> dict:
    """Copy ``{train,test}.parquet`` with each prompt as raw text ending in the forced ``prefix``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl.utils.dataset.rl_dataset import as_messages

    os.makedirs(out, exist_ok=True)
    counts = {}
    for split in ("train", "test"):
        rows = pq.read_table(Path(src) / f"{split}.parquet").to_pylist()
        for i, row in enumerate(rows):
            text = "\n".join(m["content"] for m in as_messages(row["prompt"], f"{src}/{split}.parquet row {i}"))
            row["prompt"] = [{"role": "user", "content": text.rstrip() + "\n" + prefix}]
        pq.write_table(pa.Table.from_pylist(rows), Path(out) / f"{split}.parquet")
        counts[split] = len(rows)
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("model")
    m.add_argument("--src", required=True, help="random model folder (benchmarks/save_random_model.py)")
    m.add_argument("--out", required=True)
    m.add_argument("--data", required=True, help="train.parquet of the data step: the turns follow its prompts")
    m.add_argument("--close_every", type=float, default=150.0, help="mean tokens per turn")
    d = sub.add_parser("data")
    d.add_argument("--src", required=True, help="folder with Search-R1 train/test parquet files")
    d.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.what == "model":
        print(json.dumps(make_search_model(args.src, args.out, args.data, args.close_every)))
    else:
        print(json.dumps(make_search_data(args.src, args.out)))


if __name__ == "__main__":
    main()
