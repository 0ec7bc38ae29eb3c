"""Search-R1's environment (``env.name=search_r1``): its tags, prompt, observations and rewards."""

from search_r1.envs.search_r1.env import SearchR1Environment, search_rollout

__all__ = ["SearchR1Environment", "search_rollout"]
