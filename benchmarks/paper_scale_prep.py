"""Inputs of the paper-length training runs (issue 21, part 2): a random model that searches, and data
whose prompts open a search.

A randomly initialised policy samples almost uniformly over its 151,936 ids, so it never writes the
stop string ``</search>``: every turn runs to its token limit and ends the trajectory, and no
multi-turn context ever forms, forced ``<search>`` prefix or not. ``model`` therefore

1. adds ``<search>`` and ``</search>`` to the (borrowed) tokenizer as single tokens and drops its chat
   template (prompts are raw text, as for Search-R1's base-model runs), and
2. biases the random weights so that, in the turns that follow the data's prompts, ``</search>`` is
   sampled with probability ~``1/close_every`` and ``<search>`` with ~twice that: the first layer's
   attention writes a large constant into one residual coordinate at every position (a value channel
   whose weights are zero and whose bias is one, read by one output-projection entry), so the final
   hidden state points along that coordinate whatever the context, and the two tokens' output-embedding
   rows get an entry there (every other row's is zero), which raises exactly their two logits, by the
   same amount wherever the turn is. The offsets are solved in closed form from the final hidden
   states of real prompts followed by uniformly drawn ids (:class:`TurnLogits`), then checked by a
   forward pass.

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
BIAS_COORD = 0  # the residual coordinate carrying the bias
VALUE_CHANNEL = 0  # the first layer's value channel (of its first key/value head) that writes it
# That coordinate is a multiple of the norm of everything else in the final residual stream
# (:func:`base_value`): the final hidden state then points along it at every position, whatever the
# context, and the bias is the same everywhere. A coordinate small against that norm lets the layers' own
# writes to it, which vary with the context, decide how much bias reaches the logits.
# Every weight that carries the bias is of order 0.1 or more (the final norm's weight on the coordinate
# stays 1, the tokens' entries are their logit offsets over ~sqrt(hidden)): AdamW moves each weight by ~lr a
# step whatever its gradient, so a tiny weight in the path (e.g. a norm weight scaled down to keep
# bfloat16 logits small) would let a few updates of a zero-reward run rescale every offset.
BASE_MARGIN = 4.0
MAX_OFFSET = 64.0  # the largest embedding entry tried for the two tokens


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
    their offsets: the final (normed) hidden states ``h`` (N, H) are computed once, and a token's logit
    is ``h @ W[t]`` (``W`` the output embedding), whose ``BIAS_COORD`` entry is the offset; every other
    token's entry there is zero. The hidden states depend on the offsets only through the prompts' own
    ``<search>`` (the forced prefix): :func:`bias_model` recomputes them after each round.
    """

    def __init__(self, model, inputs, start: int, token_ids: Sequence[int]) -> None:
        import torch

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

        logits = {t: self.without_bias[t] + self.h0 * off for t, off in offsets.items()}
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


def write_base(model, value: float) -> None:
    """Make the first layer's attention add ``value`` to ``BIAS_COORD`` of the residual stream at every
    position, and clear that coordinate everywhere else it is read or written: value channel
    ``VALUE_CHANNEL`` of the first key/value head gets zero weights and bias 1 (attention averages it to
    exactly 1 whatever the context), the output projection reads it only into the coordinate (``value``,
    from the group's first head), the embeddings' entries there are zero (the two tokens' offsets are
    written after this) and the final norm's weight on it is 1.

    Raises:
        ValueError: the first layer's value projection has no bias (Qwen2 models have one).
    """
    attn = model.base_model.layers[0].self_attn
    config = model.config
    if attn.v_proj.bias is None:
        raise ValueError(f"{type(model).__name__}: the first layer's v_proj has no bias to write the search bias with")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    group = config.num_attention_heads // config.num_key_value_heads  # query heads reading the first kv head
    columns = [head * head_dim + VALUE_CHANNEL for head in range(group)]
    attn.v_proj.weight[VALUE_CHANNEL] = 0.0
    attn.v_proj.bias[VALUE_CHANNEL] = 1.0
    attn.o_proj.weight[:, columns] = 0.0
    attn.o_proj.weight[BIAS_COORD, columns[0]] = value
    model.get_input_embeddings().weight[:, BIAS_COORD] = 0.0
    model.get_output_embeddings().weight[:, BIAS_COORD] = 0.0
    model.base_model.norm.weight[BIAS_COORD] = 1.0


def base_value(model, inputs, start: int) -> float:
    """``BASE_MARGIN`` x the largest norm of the final residual stream (the final norm's input) at the
    turn positions of ``inputs``, the bias coordinate left out, rounded up to a power of two (exact in
    bfloat16). Measured with the coordinate written small (:func:`write_base` with 1): a larger one only
    shrinks the rest, as the layers see normalized inputs, in which it then takes a larger share."""
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
    """Bias ``model`` so that, in the turns of ``prompts``, ``</search>`` has mean probability
    ``1/close_every`` and ``<search>`` twice that.

    :func:`write_base` puts ``base_value`` (``BASE_MARGIN`` x the rest of the final residual stream) into
    the bias coordinate at every position; the two tokens' output-embedding entries there are their
    offsets. The probabilities are measured where turns are generated: after a real prompt (its forced
    prefix included), over ``seq_len`` uniformly drawn ids. Both offsets are solved together (the tokens
    compete), ``rounds`` times with the hidden states recomputed, then checked by a real forward pass.

    Args:
        prompts: token ids of prompts as the trainer renders them (the forced prefix at their end);
            the first ``batch`` are used.
    Returns:
        ``{"open": (offset, probability), "close": (offset, probability), "base_value",
        "target_close_every", "expected_turn_tokens"}`` (the probabilities and turn length of the check).
    Raises:
        ValueError: no prompt is given, the first layer has no value bias, a probability is out of
            reach, or the check finds ``</search>`` off its target by more than 2x.
    """
    import torch

    if not prompts:
        raise ValueError("bias_model needs prompts: the turns' probabilities depend on them")
    targets = {open_id: 2.0 / close_every, close_id: 1.0 / close_every}
    output = model.get_output_embeddings().weight
    inputs, start = turn_inputs(prompts[:batch], output.shape[0], (open_id, close_id), seq_len)
    inputs = inputs.to(output.device)
    offsets = {open_id: 0.0, close_id: 0.0}
    with torch.no_grad():
        write_base(model, 1.0)
        base = base_value(model, inputs, start)
        write_base(model, base)
        for _ in range(rounds):
            for token, offset in offsets.items():
                output[token, BIAS_COORD] = offset
            turn = TurnLogits(model, inputs, start, (open_id, close_id))
            for _ in range(4):  # each token solved with the other in place, to a fixed point
                for token, target in targets.items():
                    offsets[token] = _solve_offset(lambda off, t=token: turn.probabilities({**offsets, t: off})[t],
                                                   token, target, MAX_OFFSET)
        for token, offset in offsets.items():
            output[token, BIAS_COORD] = offset
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
