"""A prompt that opens ``<answer>``/``<search>`` itself: the reward scores the action the loop parsed.

Rollout (scripted engine, real tokenizer, real retriever server) -> the reward manager with the EM
and with the format-aware score, in both rollout modes.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.rollout.conftest import chat_prompt
from tests.rollout.scripted import ScriptedEngine, search_loop
from tests.rollout.test_generation_loop import PARAMS
from verl.protocol import DataProto
from search_r1.envs.search_r1 import reward, reward_format
from verl.workers.reward_manager import RewardManager

FORMAT = {"structure_format_score": 0.2, "final_format_score": 0.1, "retrieval_score": 0.1}
QUESTION = "Where was Manuel Díaz Rodríguez born?"
ROWS = [  # (forced assistant prefix, turns the model writes)
    ("<think>I know this.</think>\n<answer>", [" Caracas </answer>"]),
    ("<think>I need to look this up.</think>\n<search>",
     [" Manuel Díaz Rodríguez </search>", "<think>Found it.</think>\n<answer> Caracas </answer>"]),
    ("", ["<think>Easy.</think>\n<answer> Caracas </answer>"]),
]


def rollout(tokenizer, retriever, mode):
    prompts = [chat_prompt(tokenizer, f"{QUESTION} ({i})", prefix) for i, (prefix, _) in enumerate(ROWS)]
    engine = ScriptedEngine(tokenizer, prompts, [turns for _, turns in ROWS])
    config = dict(max_turns=2, max_prompt_length=2048, max_response_length=600, max_obs_length=200,
                              mode=mode)
    out = search_loop(tokenizer, engine, retriever, **config).run(
        DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts}), PARAMS)
    out.non_tensor_batch["data_source"] = np.array(["nq"] * len(ROWS), dtype=object)
    out.non_tensor_batch["reward_model"] = np.array(
        [{"style": "rule", "ground_truth": {"target": ["Caracas"]}} for _ in ROWS], dtype=object)
    return out


def scores(tokenizer, out, **score_kwargs) -> list[float]:
    return RewardManager(tokenizer, reward.compute_score, **score_kwargs)(out).sum(-1).tolist()


def test_forced_prefix_rows_earn_the_reward(tokenizer, retriever, mode):
    out = rollout(tokenizer, retriever, mode)
    assert out.non_tensor_batch["action_prefix"].tolist() == ["<answer>", "<search>", ""]
    assert out.batch["finished"].tolist() == [1, 1, 1] and out.batch["valid_search"].tolist() == [0, 1, 0]
    assert scores(tokenizer, out) == [1.0, 1.0, 1.0]
    # format-aware: the prompt wrote the <think> block, so a prefixed row is well formed from its tag
    # on; the row without a prefix is checked from the start as before
    assert scores(tokenizer, out, **FORMAT) == [1.0, 1.0, 1.0]


def test_format_check_starts_inside_the_opened_tag():
    answer = "<answer> Caracas </answer>"
    assert not reward_format.is_valid_sequence(answer)  # the model opened <answer> without thinking
    assert reward_format.is_valid_sequence(answer, action_prefix="<answer>")  # the prompt opened it
    searched = "<search> q </search>\n\n<information>Doc</information>\n\n<think>t</think><answer> a </answer>"
    assert reward_format.is_valid_sequence(searched, action_prefix="<search>")
    assert reward_format.compute_score_em(answer, ["Caracas"], **FORMAT, action_prefix="<answer>") == 1.0
    assert reward_format.compute_score_em(answer, ["Caracas"], **FORMAT) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="action_prefix"):
        reward_format.check_format(" Caracas </answer>", action_prefix="<answer>")
