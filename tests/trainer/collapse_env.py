"""A Search-R1 environment whose training reward pays for broken trajectories (tests only).

Reward hacking made on purpose: the score is 1 for a response whose tags are broken or that gives no
answer, 0 otherwise, while ``em`` (what validation reports) stays the true exact match. GRPO on it
drives a policy that answered well into the collapse the health signals are meant to see first.
Selected with ``env.module=tests.trainer.collapse_env env.name=search_r1_broken_reward``.
"""

from __future__ import annotations

from search_r1.envs.search_r1.env import SearchR1Environment
from search_r1.envs.search_r1.health import health_signals
from verl.envs import register_environment


@register_environment
class BrokenRewardEnvironment(SearchR1Environment):
    """Search-R1 with the reward above."""

    name = "search_r1_broken_reward"

    def compute_score(self, data_source: str, solution_str: str, ground_truth, extra_info=None, **kwargs) -> dict:
        signals = health_signals([solution_str])
        broken = bool(signals["broken_tags"][0] or signals["no_answer"][0])
        return {**super().compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs),
                "score": float(broken)}
