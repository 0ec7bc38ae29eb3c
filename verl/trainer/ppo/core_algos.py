"""veRL's import path of the PPO algorithms (``verl.trainer.ppo.core_algos``), kept for users' code.

The algorithms live in :mod:`verl.algorithms`; this module only re-exports them.
"""

from verl.algorithms import *  # noqa: F401,F403
from verl.algorithms import __all__  # noqa: F401
