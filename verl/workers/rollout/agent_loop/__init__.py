"""The multi-turn agent loop: an environment's turns over an engine, sync or async, packed as a DataProto."""

from verl.workers.rollout.agent_loop.loop import MultiTurnRollout, TurnProgress
from verl.workers.rollout.agent_loop.rules import LoopConfig

__all__ = ["LoopConfig", "MultiTurnRollout", "TurnProgress"]
