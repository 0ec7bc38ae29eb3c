"""The search-biased random model and forced-prefix data of the paper-scale training runs."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from benchmarks.paper_scale_prep import (BIAS_COORD, CLOSE, MAX_OFFSET, OPEN, PREFIX, TurnLogits, bias_model,
                                         make_search_data, make_search_model, prompt_ids, turn_inputs,
                                         turn_statistics, write_base)
from benchmarks.shapes import Shape, build_random_model
from search_r1.envs.search_r1.prompts import prompt_messages

QUESTIONS = ["who wrote the novel the old man and the sea?", "when did the berlin wall fall?",
             "what is the capital city of australia?", "which planet has the most moons?"]


@pytest.fixture(scope="module")
def random_model_dir(tmp_path_factory):
    """A 2-layer Qwen2 with the full 151,936-id vocabulary (what the bias must beat) and SmolLM2's tokenizer."""
    from transformers import AutoTokenizer

    from verl.utils.model_zoo import smollm2_dir

    out = tmp_path_factory.mktemp("model") / "random"
    shape = Shape(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128)
    build_random_model(shape, torch.bfloat16, "cpu").save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2_dir()).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def search_data(tmp_path_factory):
    """Search-R1-templated questions with the forced prefix (the data step's output)."""
    src = tmp_path_factory.mktemp("src")
    rows = [{"prompt": prompt_messages(q), "data_source": "nq", "reward_model": {"ground_truth": {"target": ["a"]}}}
            for q in QUESTIONS]
    for split in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(rows), src / f"{split}.parquet")
    out = src.parent / "search_data"
    make_search_data(str(src), str(out))
    return out / "train.parquet"


def _biased_model(random_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(random_model_dir)
    tokenizer.add_tokens([OPEN, CLOSE])
    tokenizer.chat_template = None
    return model, tokenizer, tokenizer.convert_tokens_to_ids([OPEN, CLOSE])


def test_turn_probabilities_in_closed_form_match_a_forward_pass(random_model_dir, search_data):
    """The calibration's closed form (hidden states once, the two logits as functions of the offsets)
    gives what the biased model computes, in the contexts turns are generated in."""
    model, tokenizer, (open_id, close_id) = _biased_model(random_model_dir)
    prompts = prompt_ids(tokenizer, str(search_data))
    assert tokenizer.convert_ids_to_tokens(prompts[0][-1:]) == [OPEN] and len(prompts) == len(QUESTIONS)
    inputs, start = turn_inputs(prompts, model.get_input_embeddings().weight.shape[0], (open_id, close_id), 40)
    assert inputs.shape == (len(QUESTIONS), start + 40) and inputs[0, start - 1] == open_id
    assert not torch.isin(inputs[:, start:], torch.tensor([open_id, close_id])).any()
    weight = model.get_output_embeddings().weight
    with torch.no_grad():
        write_base(model, 8.0)
        turn = TurnLogits(model, inputs, start, (open_id, close_id))
        offsets = {open_id: 0.4, close_id: 0.6}  # x sqrt(hidden) = 8: logits raised by ~3 and ~5
        for token, offset in offsets.items():
            weight[token, BIAS_COORD] = offset
        probs = model(input_ids=inputs).logits[:, start - 1:-1].softmax(-1)
    # the hidden states saw the prompt's <search> without its offset: equal up to that token's influence
    got = turn.probabilities(offsets)
    assert got[close_id] == pytest.approx(float(probs[..., close_id].mean()), rel=0.05)
    assert got[open_id] == pytest.approx(float(probs[..., open_id].mean()), rel=0.05)
    assert got[close_id] > 20 / weight.shape[0]  # the offsets count: far above a uniform draw


def test_biased_model_closes_searches_at_the_calibrated_rate(random_model_dir, search_data, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = make_search_model(str(random_model_dir), str(tmp_path / "search"), str(search_data), close_every=30.0,
                             device="cpu")
    assert info["decoded"] == OPEN + CLOSE
    assert info["close"][1] == pytest.approx(1 / 30, rel=0.5) and info["open"][1] == pytest.approx(2 / 30, rel=0.5)
    assert 10 < info["expected_turn_tokens"] < 60  # within the 128 measured tokens
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "search")
    assert not tokenizer.chat_template and json.loads((tmp_path / "search" / "search_bias.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "search", dtype=torch.float32)  # saved in bf16
    assert next(AutoModelForCausalLM.from_pretrained(tmp_path / "search").parameters()).dtype == torch.bfloat16
    prompt = torch.tensor(prompt_ids(tokenizer, str(search_data))[:1])
    assert tokenizer.convert_ids_to_tokens(prompt[0, -1:].tolist()) == [OPEN]
    torch.manual_seed(0)
    out = model.generate(prompt.repeat(16, 1), do_sample=True, max_new_tokens=200, top_k=0, top_p=1.0,
                         pad_token_id=0)[:, prompt.shape[1]:]
    close = tokenizer.convert_tokens_to_ids(CLOSE)
    closed = [(row == close).nonzero()[0].item() for row in out if (row == close).any()]
    # Geometric with p = 1/30: nearly every row closes within 200 tokens, after ~30 on average.
    assert len(closed) >= 14 and 8 < sum(closed) / len(closed) < 80


def test_search_data_ends_every_prompt_with_the_prefix(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for split in ("train", "test"):
        rows = [{"prompt": [{"role": "user", "content": f"Answer the question. Question: q{i}?"}],
                 "data_source": "nq", "reward_model": {"ground_truth": {"target": ["a"]}}} for i in range(3)]
        pq.write_table(pa.Table.from_pylist(rows), src / f"{split}.parquet")
    assert make_search_data(str(src), str(tmp_path / "out")) == {"train": 3, "test": 3}
    rows = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert rows[1]["prompt"] == [{"role": "user", "content": "Answer the question. Question: q1?\n" + PREFIX}]
    assert rows[1]["reward_model"] == {"ground_truth": {"target": ["a"]}}


def test_the_bias_is_the_same_at_every_turn_position_and_after_any_context(random_model_dir, search_data):
    """The turn's first position (where the prompt's own ``<search>`` is the input) and random-id contexts
    get the rate the turns after real prompts were calibrated to: the coordinate dominates the final hidden
    state everywhere (a coordinate small against the rest of the residual stream fails this)."""
    model, tokenizer, (open_id, close_id) = _biased_model(random_model_dir)
    prompts = prompt_ids(tokenizer, str(search_data))
    bias_model(model, open_id, close_id, prompts, close_every=30.0)
    inputs, start = turn_inputs(prompts, model.get_input_embeddings().weight.shape[0], (open_id, close_id), 64)
    with torch.no_grad():
        close = model(input_ids=inputs).logits[:, start - 1:-1].float().softmax(-1)[..., close_id]
    assert close[:, 0].mean() == pytest.approx(1 / 30, rel=0.3)  # predicted from <search> itself
    assert close[:, 32:].mean() == pytest.approx(1 / 30, rel=0.5)
    vocab = model.get_input_embeddings().weight.shape[0]
    random_context = [torch.randint(0, open_id, (len(prompts[0]),)).tolist() for _ in prompts]
    assert turn_statistics(model, *turn_inputs(random_context, vocab, (open_id, close_id), 64, seed=3),
                           open_id, close_id)["close"] == pytest.approx(1 / 30, rel=0.5)


def test_the_offsets_are_solved_past_their_first_range_and_an_unreachable_rate_fails(random_model_dir,
                                                                                  search_data):
    """The coordinate's base is a power of two above the rest of the residual stream, written by the first
    layer's attention; the offsets' search widens from its first range to what the rate needs, and says
    when a rate cannot be reached; no prompts, or no value bias to write the base with, is refused."""
    model, tokenizer, (open_id, close_id) = _biased_model(random_model_dir)
    prompts = prompt_ids(tokenizer, str(search_data))
    info = bias_model(model, open_id, close_id, prompts, close_every=30.0, rounds=1)
    base = info["base_value"]
    assert base == 2 ** round(math.log2(base)) and model.model.layers[0].self_attn.o_proj.weight[0, 0] == base
    assert info["close"][0] > MAX_OFFSET / 2 ** 10 and info["close"][1] == pytest.approx(1 / 30, rel=0.5)
    with pytest.raises(ValueError, match=f"token {open_id}: probability 2 not reached"):
        bias_model(model, open_id, close_id, prompts, close_every=1.0, rounds=1)
    with pytest.raises(ValueError, match="needs prompts"):
        bias_model(model, open_id, close_id, [], close_every=30.0)
    model.model.layers[0].self_attn.v_proj.bias = None
    with pytest.raises(ValueError, match="v_proj has no bias"):
        bias_model(model, open_id, close_id, prompts, close_every=30.0)


def test_the_bias_survives_updates_that_only_raise_the_entropy(random_model_dir, search_data):
    """A zero-reward GRPO run's only gradient is the entropy bonus, and AdamW moves every weight by ~lr a
    step whatever the gradient's size: the turn length must not depend on a weight small against lr
    (a final-norm weight scaled down by sqrt(hidden) x base would shrink every offset each step)."""
    model, tokenizer, (open_id, close_id) = _biased_model(random_model_dir)
    with torch.no_grad():  # a residual stream as loud as a deep model's (the base is then 128, not 2)
        model.model.layers[-1].mlp.down_proj.weight.mul_(1000.0)
    prompts = prompt_ids(tokenizer, str(search_data))
    assert bias_model(model, open_id, close_id, prompts, close_every=30.0)["base_value"] >= 64
    inputs, start = turn_inputs(prompts, model.get_input_embeddings().weight.shape[0], (open_id, close_id), 64)
    before = turn_statistics(model, inputs, start, open_id, close_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for _ in range(10):
        log_probs = model(input_ids=inputs).logits[:, start - 1:-1].float().log_softmax(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        optimizer.zero_grad()
        (-entropy).backward()
        optimizer.step()
    after = turn_statistics(model, inputs, start, open_id, close_id)
    # a weight small against lr on the bias's path moves the rate by far more than 5% in 10 steps
    assert after["close"] == pytest.approx(before["close"], rel=0.05)
    assert after["open"] == pytest.approx(before["open"], rel=0.05)
