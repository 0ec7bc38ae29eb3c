"""RewardManager on real tokenizers: score placement with pad == eos, extra info, per-source means."""

import numpy as np
import pytest
import torch

from search_r1.envs.search_r1 import reward
from verl.protocol import DataProto
from verl.workers.reward_manager import RewardManager, mean_by_data_source, response_lengths


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def make_batch(tokenizer, texts, sources, golds, width=48, observation_spans=None):
    """A generated batch: responses right padded with pad (== eos for SmolLM2), each ending in eos."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompt = tokenizer("Question?", add_special_tokens=False)["input_ids"]
    responses, attention, response_mask, lengths = [], [], [], []
    for row, text in enumerate(texts):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        assert len(ids) <= width
        lengths.append(len(ids))
        responses.append(ids + [pad] * (width - len(ids)))
        attention.append([1] * len(ids) + [0] * (width - len(ids)))
        mask = attention[-1].copy()
        for start, end in (observation_spans or {}).get(row, []):
            mask[start:end] = [0] * (end - start)
        response_mask.append(mask)
    responses = torch.tensor(responses)
    prompts = torch.tensor([prompt] * len(texts))
    tensors = {
        "prompts": prompts, "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": torch.cat([torch.ones_like(prompts), torch.tensor(attention)], dim=1),
        "response_mask": torch.tensor(response_mask),
    }
    non_tensors = {"data_source": np.array(sources, dtype=object),
                   "reward_model": np.array([{"style": "rule", "ground_truth": {"target": g}}
                                             for g in golds], dtype=object)}
    return DataProto.from_dict(tensors, non_tensors), lengths


def test_score_on_last_real_token_when_pad_is_eos(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.pad_token_id == tok.eos_token_id
    texts = ["<think>x</think><answer>Paris</answer>", "<answer>Lyon</answer>",
             "<think>long thinking here</think><answer>the beatles</answer>"]
    data, lengths = make_batch(tok, texts, ["nq", "nq", "hotpotqa"],
                               [["Paris"], ["Paris"], np.array(["Beatles"], dtype=object)])
    scores = RewardManager(tok, reward.compute_score)(data)
    assert scores.shape == data.batch["responses"].shape and scores.dtype == torch.float32
    for row, length in enumerate(lengths):
        nonzero = scores[row].nonzero().flatten().tolist()
        expected = [length - 1] if row != 1 else []
        assert nonzero == expected
    # the last real token is the eos itself, which equals pad: found from the mask, not the id
    assert data.batch["responses"][0, lengths[0] - 1] == tok.pad_token_id
    assert scores[0, lengths[0] - 1] == 1.0 and scores[2, lengths[2] - 1] == 1.0


def test_response_lengths_from_masks(smollm2_tokenizer):
    tok = smollm2_tokenizer
    text = "<search>q</search>\n\n<information>doc</information>\n\n"
    num_text = len(tok(text, add_special_tokens=False)["input_ids"])
    # tokens 5..num_text are an observation (response_mask 0); the final eos is generated
    data, lengths = make_batch(tok, [text], ["nq"], [["x"]], observation_spans={0: [(5, num_text)]})
    assert response_lengths(data.batch).tolist() == lengths == [num_text + 1]
    only_response_mask = {"responses": data.batch["responses"],
                          "response_mask": data.batch["response_mask"]}
    assert response_lengths(only_response_mask).tolist() == lengths


def test_return_dict_extra_info_and_means(smollm2_tokenizer):
    tok = smollm2_tokenizer
    texts = ["<answer>Paris</answer>", "<answer>no</answer>", "<think>a</think><answer>yes</answer>"]
    data, _ = make_batch(tok, texts, ["nq", "nq", "hotpotqa"], [["Paris"], ["Paris"], ["yes"]])
    manager = RewardManager(tok, reward.compute_score, num_examine=1, structure_format_score=0.2,
                            final_format_score=0.1, retrieval_score=0.1)
    out = manager(data, return_dict=True)
    assert set(out) == {"reward_tensor", "reward_extra_info"}
    info = out["reward_extra_info"]
    assert info["score"] == pytest.approx([0.8, 0.1, 1.0])  # invalid+EM, invalid wrong, valid+EM
    assert info["em"] == [1.0, 0.0, 1.0]
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx(info["score"])
    assert manager.last_data_source_means == pytest.approx({"hotpotqa": 1.0, "nq": 0.45})


def test_custom_compute_score_dict_result(smollm2_tokenizer):
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": float(len(solution_str) > 3), "length": len(solution_str)}

    data, _ = make_batch(smollm2_tokenizer, ["abcd", "ab"], ["custom", "custom"], [["x"], ["x"]])
    out = RewardManager(smollm2_tokenizer, compute_score)(data, return_dict=True)
    assert out["reward_extra_info"] == {"score": [1.0, 0.0], "length": [4, 2]}


def test_bad_arguments(smollm2_tokenizer):
    with pytest.raises(TypeError, match="compute_score must be callable"):
        RewardManager(smollm2_tokenizer, 5)
    data, _ = make_batch(smollm2_tokenizer, ["x"], ["nq"], [["x"]])
    data.non_tensor_batch["reward_model"] = np.array([{"style": "rule"}], dtype=object)
    with pytest.raises(ValueError, match="row 0.*ground_truth"):
        RewardManager(smollm2_tokenizer, reward.compute_score)(data)


def test_mean_by_data_source():
    assert mean_by_data_source(["a", "b", "a"], [1.0, 0.0, 0.0]) == {"a": 0.5, "b": 0.0}
