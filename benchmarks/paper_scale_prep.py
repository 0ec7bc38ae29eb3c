"""Inputs of the paper-length training runs (issue 21, part 2): a random model that searches, and data
whose prompts open a search.

A randomly initialised policy samples almost uniformly over its 151,936 ids, so it never writes the
stop string ``</search>``: every turn runs to its token limit and ends the trajectory, and no
multi-turn context ever forms, forced ``<search>`` prefix or not. ``model`` therefore

1. adds ``<search>`` and ``</search>`` to the (borrowed) tokenizer as single tokens and drops its chat
   template (prompts are raw text, as for Search-R1's base-model runs), and
2. biases the random weights so that, at every position, ``</search>`` is sampled with probability
   ~``1/close_every`` and ``<search>`` with ~twice that: one embedding coordinate is set to a constant
   for every token (so the final hidden state carries a large, fixed-sign component along it) and
   raised further for the two tokens. With tied embeddings that raises exactly those two logits.
   The offsets are found by bisection on measured probabilities (one forward pass each), each token
   recalibrated with the other in place (they compete where the coordinate is strongest).

Turns then end after ~``close_every`` tokens with a ``</search>``; the first turn, opened by the
forced prefix, is a valid search, later ones are valid when ``<search>`` came first (~2/3), else
they get the corrective message; either way the row continues, so contexts grow by an observation
per turn (500 tokens at the paper's ``max_obs_length``) up to ``max_turns``. Throughput does not
depend on the weight values; the bias only shapes where turns end.

    python benchmarks/paper_scale_prep.py model --src /tmp/q3b --out /tmp/q3b-search
    python benchmarks/paper_scale_prep.py data --src data/example_search --out /tmp/paper_data
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PREFIX = "<think>I need to look this up.</think>\n<search>"
OPEN, CLOSE = "<search>", "</search>"
BIAS_COORD = 0  # the embedding coordinate carrying the bias
BASE_VALUE = 1.0  # that coordinate for every token: dominates the residual stream's sign
MAX_OFFSET = 1024.0  # the largest offset tried for the two tokens


def token_probabilities(model, token_ids: list[int], seq_len: int = 128, batch: int = 4, seed: int = 0) -> list[float]:
    """Mean next-token probability of each of ``token_ids`` over random input sequences."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    vocab = model.get_input_embeddings().weight.shape[0]
    device = next(model.parameters()).device
    inputs = torch.randint(0, vocab, (batch, seq_len), generator=gen).to(device)
    with torch.inference_mode():
        probs = model(input_ids=inputs).logits.float().softmax(-1)
    return [float(probs[..., t].mean()) for t in token_ids]


def _calibrate(model, token: int, target: float, iterations: int, samples: dict) -> float:
    """Set ``token``'s bias offset so its mean probability is ``target`` (bisection); returns the offset.

    Raises:
        ValueError: ``target`` is not reached at ``MAX_OFFSET``.
    """
    weight = model.get_input_embeddings().weight

    def probability_at(offset: float) -> float:
        weight[token, BIAS_COORD] = BASE_VALUE + offset
        return token_probabilities(model, [token], **samples)[0]

    low, high = 0.0, 8.0
    while probability_at(high) < target:  # deeper models damp the bias more (the 3B shape needs ~10)
        if high >= MAX_OFFSET:
            raise ValueError(f"token {token}: probability {target:.4g} not reached at offset {high}")
        low, high = high, high * 2
    for _ in range(iterations):
        mid = (low + high) / 2
        low, high = (mid, high) if probability_at(mid) < target else (low, mid)
    weight[token, BIAS_COORD] = BASE_VALUE + (low + high) / 2
    return (low + high) / 2


def bias_model(model, open_id: int, close_id: int, close_every: float = 150.0, iterations: int = 14,
               rounds: int = 3, batch: int = 4, seq_len: int = 128) -> dict:
    """Set the embedding bias so ``</search>`` has probability ~1/close_every and ``<search>`` twice that.

    The two tokens draw on the same coordinate, so they compete at the positions where it is strongest:
    each is recalibrated with the other in place, ``rounds`` times. Probabilities are means over
    ``batch`` x ``seq_len`` random positions (the bisection's sample; the returned ones use another).

    Returns:
        ``{"open": (offset, probability), "close": (offset, probability)}``.
    Raises:
        ValueError: the model's input and output embeddings are not tied (the bias needs both), or a
            probability is out of reach.
    """
    import torch

    if model.get_output_embeddings() is not None and \
            model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        raise ValueError("bias_model needs tied input/output embeddings (Qwen2.5-3B ties them)")
    targets = {open_id: 2.0 / close_every, close_id: 1.0 / close_every}
    samples = {"batch": batch, "seq_len": seq_len}
    with torch.no_grad():
        model.get_input_embeddings().weight[:, BIAS_COORD] = BASE_VALUE
        found = {}
        for _ in range(rounds):
            for token, target in targets.items():
                found[token] = _calibrate(model, token, target, iterations, samples)
        probs = token_probabilities(model, [open_id, close_id], seed=1, **samples)
    return {"open": (found[open_id], probs[0]), "close": (found[close_id], probs[1]),
            "target_close_every": close_every}


def make_search_model(src: str, out: str, close_every: float = 150.0, device: str | None = None) -> dict:
    """Load a random model folder, add the search tokens, bias it, save to ``out``."""
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
    # a GPU measures the means over 4,096 positions (the 3B shape's are heavy-tailed: a few positions carry them)
    samples = {"batch": 16, "seq_len": 256} if device != "cpu" else {}
    info = bias_model(model, open_id, close_id, close_every, **samples)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    config = Path(out) / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data.pop("chat_template", None)
    config.write_text(json.dumps(data, indent=2))
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
    m.add_argument("--close_every", type=float, default=150.0, help="mean tokens per turn")
    d = sub.add_parser("data")
    d.add_argument("--src", required=True, help="folder with Search-R1 train/test parquet files")
    d.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.what == "model":
        print(json.dumps(make_search_model(args.src, args.out, args.close_every)))
    else:
        print(json.dumps(make_search_data(args.src, args.out)))


if __name__ == "__main__":
    main()
