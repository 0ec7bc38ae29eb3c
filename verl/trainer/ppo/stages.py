"""The stages of one PPO/GRPO step as small functions over a DataProto (the flow in docs/architecture.md).

Each function does one line of the step: expand prompts into groups, score responses, turn
scores into rewards (optionally minus a KL penalty) and rewards into advantages. The trainer calls
them in order; the tensor maths lives in :mod:`verl.algorithms`.
"""

from __future__ import annotations

import uuid

import numpy as np

from verl import algorithms
from verl.algorithms.config import AlgorithmConfig

# Per-row fields the rollout may drop and the later stages still need.
_CARRIED_FIELDS = ("uid", "data_source", "reward_model", "extra_info", "index", "ability")


def expand_groups(batch, n: int):
    """Give each prompt a fresh uid, then repeat it ``n`` times (copies adjacent: a GRPO group).

    uids are random UUIDs rather than dataset indices, so rows of two merged data sources with the
    same index never share a group (a Search-R1 bug).
    """
    uids = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    batch.non_tensor_batch["uid"] = uids
    return batch.repeat(repeat_times=n, interleave=True) if n > 1 else batch


def carry_row_fields(source, generated):
    """Copy per-row fields of the prompt batch into the generated batch when it lacks them."""
    for key in _CARRIED_FIELDS:
        if key in source.non_tensor_batch and key not in generated.non_tensor_batch:
            generated.non_tensor_batch[key] = source.non_tensor_batch[key]
    return generated


def score(batch, reward_fn) -> dict:
    """Put ``token_level_scores`` (B, R) on the batch; returns the reward manager's extra info."""
    result = reward_fn(batch, return_dict=True)
    batch.batch["token_level_scores"] = result["reward_tensor"]
    return result.get("reward_extra_info", {})


def apply_rewards(batch, algorithm: AlgorithmConfig, kl_ctrl) -> dict:
    """``token_level_rewards`` = scores, minus ``beta * KL(actor || ref)`` when ``use_kl_in_reward``.

    The in-reward KL placement is Search-R1's PPO default (Ouyang et al. 2022, eq. 2); the other
    placement, a KL loss term in the actor update, is ``actor.use_kl_loss``. Returns KL metrics.
    """
    scores = batch.batch["token_level_scores"]
    if not algorithm.use_kl_in_reward:
        batch.batch["token_level_rewards"] = scores
        return {}
    rewards, metrics = algorithms.apply_kl_penalty(
        scores, batch.batch["old_log_probs"], batch.batch["ref_log_probs"], batch.batch["response_mask"],
        kl_ctrl, kl_penalty=algorithm.kl_penalty)
    batch.batch["token_level_rewards"] = rewards
    return metrics


def compute_advantage(batch, algorithm: AlgorithmConfig) -> None:
    """Fill ``advantages`` and ``returns`` (B, R) with the configured estimator (gae, grpo, ...);
    GRPO groups are the rows sharing a ``uid``."""
    algorithms.compute_advantage(batch, algorithm.adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam,
                                 norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo)


def merge_outputs(batch, output) -> None:
    """Union a worker's output tensors into the batch, in place (keys must be new)."""
    for key in output.batch.keys():
        batch.batch[key] = output.batch[key]


def num_tokens(batch) -> int:
    """Real (attention-mask) tokens in the batch, for throughput."""
    return int(batch.batch["attention_mask"].sum().item())

