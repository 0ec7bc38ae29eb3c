"""The environment interface (:mod:`verl.envs.base`) and the registry that finds one by name."""

from verl.envs.base import Action, EnvConfig, Environment, Observation, ending_tag
from verl.envs.registry import load_environment, register_environment

__all__ = ["Action", "EnvConfig", "Environment", "Observation", "ending_tag", "load_environment", "register_environment"]
