"""The search-biased random model and forced-prefix data of the paper-scale training runs."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from benchmarks.paper_scale_prep import CLOSE, OPEN, PREFIX, make_search_data, make_search_model
from benchmarks.shapes import Shape, build_random_model


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


def test_biased_model_closes_searches_at_the_calibrated_rate(random_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = make_search_model(str(random_model_dir), str(tmp_path / "search"), close_every=30.0, device="cpu")
    assert info["decoded"] == OPEN + CLOSE
    assert info["close"][1] == pytest.approx(1 / 30, rel=0.5) and info["open"][1] == pytest.approx(2 / 30, rel=0.5)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "search")
    assert not tokenizer.chat_template and json.loads((tmp_path / "search" / "search_bias.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "search", dtype=torch.float32)  # saved in bf16
    assert next(AutoModelForCausalLM.from_pretrained(tmp_path / "search").parameters()).dtype == torch.bfloat16
    prompt = tokenizer("Question: who wrote it?\n" + PREFIX, return_tensors="pt").input_ids
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


def test_bias_offset_grows_past_its_first_range_and_an_unreachable_rate_fails(random_model_dir):
    """Deeper models damp the bias (the 3B shape needed ~10): the search widens past 8, and says when it cannot."""
    from transformers import AutoModelForCausalLM

    from benchmarks.paper_scale_prep import bias_model

    model = AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32)
    with torch.no_grad():  # a final norm 10x smaller: every logit, the bias's too, 10x flatter
        model.model.norm.weight.mul_(0.1)
    info = bias_model(model, 49152, 49153, close_every=30.0, iterations=10, rounds=1)
    assert info["close"][0] > 8 and info["close"][1] == pytest.approx(1 / 30, rel=0.5)
    with pytest.raises(ValueError, match="token 49152: probability 2 not reached"):
        bias_model(model, 49152, 49153, close_every=1.0, iterations=2, rounds=1)
