"""Reward managers: a generated batch -> token-level scores (B, R)."""

from verl.workers.reward_manager.naive import RewardManager, mean_by_data_source, response_lengths

NaiveRewardManager = RewardManager  # veRL's name

__all__ = ["NaiveRewardManager", "RewardManager", "mean_by_data_source", "response_lengths"]
