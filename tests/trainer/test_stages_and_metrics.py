"""The step's stages and metrics on real DataProto batches and the real algorithms."""

import numpy as np
import pytest
import torch
import dataclasses

from verl import algorithms
from verl.algorithms.config import AlgorithmConfig, KLControlConfig
from verl.protocol import DataProto
from verl.trainer.ppo import metric_utils, stages
from verl.trainer.ppo.rollout_adapter import sampling_params
from verl.workers.rollout.config import RolloutConfig


def _batch(scores, mask_rows):
    mask = torch.tensor(mask_rows, dtype=torch.float32)
    rows, width = mask.shape
    token_scores = torch.zeros(rows, width)
    for i, s in enumerate(scores):
        token_scores[i, int(mask[i].nonzero().max())] = s
    return DataProto.from_dict(
        tensors={"token_level_scores": token_scores, "response_mask": mask, "responses": torch.ones(rows, width, dtype=torch.long),
                 "attention_mask": torch.cat([torch.ones(rows, 2), mask], dim=1),
                 "old_log_probs": torch.full((rows, width), -1.0), "ref_log_probs": torch.full((rows, width), -1.5)},
        non_tensors={"turns": np.array([1, 2, 2, 1]), "valid_action": np.array([1, 2, 1, 1]),
                     "valid_search": np.array([0, 1, 1, 0]), "empty_search": np.array([0, 1, 0, 0]),
                     "finished": np.array([True, True, False, True])})


def test_expand_groups_unique_uids_adjacent_copies():
    batch = DataProto.from_dict(tensors={"x": torch.arange(3)}, non_tensors={"index": np.array([0, 0, 1])})
    out = stages.expand_groups(batch, 2)
    uids = list(out.non_tensor_batch["uid"])
    assert out.batch["x"].tolist() == [0, 0, 1, 1, 2, 2]
    assert uids[0] == uids[1] and uids[2] == uids[3] and len(set(uids)) == 3  # same index, different groups


def test_grpo_advantages_and_kl_in_reward():
    mask = [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]
    batch = _batch([1.0, 0.0, 1.0, 1.0], mask)
    batch.non_tensor_batch["uid"] = np.array(["a", "a", "b", "b"], dtype=object)
    algorithm = AlgorithmConfig(use_kl_in_reward=True, kl_penalty="kl", adv_estimator="grpo")
    kl_metrics = stages.apply_rewards(batch, algorithm, algorithms.get_kl_controller(KLControlConfig(kl_coef=0.1)))
    assert kl_metrics["actor/reward_kl_penalty"] == pytest.approx(0.5)
    # reward = score - 0.1 * (old - ref) = score - 0.05 on every response token
    assert batch.batch["token_level_rewards"][0, 0].item() == pytest.approx(-0.05)
    stages.compute_advantage(batch, algorithm)
    adv = batch.batch["advantages"]
    assert adv[0, 0] > 0 > adv[1, 0]           # group a: the correct answer gets the positive advantage
    assert adv[0, 2] == 0 and adv[2, 1] == 0  # masked positions stay zero


def test_data_and_env_metrics_named_as_verl():
    batch = _batch([1.0, 0.0, 1.0, 0.0], [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch.batch["advantages"] = batch.batch["response_mask"] * 0.5
    batch.batch["returns"] = batch.batch["response_mask"]
    from search_r1.envs.search_r1 import SearchR1Environment

    batch.batch["attention_mask"][1, 0] = 0  # the longest response's prompt is the shortest (left padding)
    metrics = metric_utils.compute_data_metrics(batch, False, SearchR1Environment)  # its counters and figures
    assert metrics["critic/score/mean"] == pytest.approx(0.5)
    # the longest row (4 tokens), not the longest prompt (2) plus the longest response (3)
    assert metrics["context_length/max"] == 4 and metrics["prompt_length/min"] == 1
    assert metrics["response_length/max"] == 3 and metrics["response_length/clip_ratio"] == pytest.approx(0.25)
    assert metrics["env/number_of_valid_search"] == pytest.approx(0.5)
    assert metrics["env/number_of_empty_search"] == pytest.approx(0.25)
    assert metrics["env/ratio_of_empty_search"] == pytest.approx(0.5)  # 1 of the 2 searches found nothing
    assert metrics["env/finish_ratio"] == pytest.approx(0.75)
    assert metrics["env/ratio_of_valid_action"] == pytest.approx((1 + 1 + 0.5 + 1) / 4)
    assert metrics["env/number_of_actions/max"] == 2


def test_throughput_and_validation_metrics():
    perf = metric_utils.compute_throughput_metrics(1000, {"step": 2.0, "old_log_prob": 0.5, "update_actor": 1.5},
                                                   num_params=10, ppo_epochs=1, num_devices=1, peak_flops=1e6)
    assert perf["perf/throughput_tokens_per_s"] == 500
    assert perf["perf/mfu/actor"] == pytest.approx(10 * 1000 * 8 / (2.0 * 1e6))
    val = metric_utils.compute_validation_metrics(["nq", "nq", "hotpotqa"], [1.0, 0.0, 1.0],
                                                  {"finished": np.array([1.0, 1.0, 0.0])})
    assert val == {"val/test_score/nq": 0.5, "val/test_score/hotpotqa": 1.0,
                   "val/test_score/all": pytest.approx(2 / 3), "val/env/finish_ratio": pytest.approx(2 / 3)}


def test_validation_sampling_is_greedy_training_samples():
    rollout = RolloutConfig()
    val = sampling_params(rollout, 64, validate=True)
    train = sampling_params(rollout, 64)
    assert val.greedy and val.temperature == 0.0
    assert not train.greedy and train.top_p == 0.95 and train.stop == []  # the agent loop sets the environment's


def test_training_requests_seeded_unless_turned_off():
    """Training requests carry ``rollout.seed`` (vLLM derives one seed per request from it) unless
    ``seed_per_request: false`` leaves sampling to the engine's RNG; validation is greedy, unseeded."""
    rollout = RolloutConfig(seed=7)
    assert sampling_params(rollout, 64).seed == 7
    assert sampling_params(rollout, 64, validate=True).seed is None
    assert sampling_params(dataclasses.replace(rollout, seed_per_request=False), 64).seed is None
