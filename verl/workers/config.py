"""Settings of the actor/rollout/reference worker (``actor_rollout_ref``) and its reference policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from verl.workers.actor.config import ActorConfig
from verl.utils.model_config import ModelConfig
from verl.workers.rollout.config import RolloutConfig


@dataclass(frozen=True)
class RefFSDPConfig:
    """FSDP2 placement of the frozen reference model (stored and computed in the actor's compute dtype:
    bf16 on a GPU by default)."""

    param_offload: bool = True
    """move the reference parameters to the CPU between uses, to the GPU for each forward (veRL's
    meaning; no effect with `offload_policy`)"""
    offload_policy: bool = False
    """FSDP2's CPUOffloadPolicy: the parameters stay on the CPU, layers copied to the GPU one at a
    time in the forward"""


@dataclass(frozen=True)
class RefConfig:
    """The frozen reference policy of the KL terms (``actor_rollout_ref.ref``)."""

    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
    """sharding of the reference model"""
    log_prob_micro_batch_size: Optional[int] = 128
    """global rows per `ref_log_probs` micro-batch (split over ranks)"""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """rows per `ref_log_probs` micro-batch per rank; wins over the global one"""
    log_prob_use_dynamic_bsz: Optional[bool] = None
    """token-count micro-batches (`null`: the actor's `use_dynamic_bsz`)"""
    log_prob_max_token_len_per_gpu: Optional[int] = None
    """token budget per micro-batch (`null`: the actor's `ppo_max_token_len_per_gpu`)"""


@dataclass(frozen=True)
class ActorRolloutRefConfig:
    """One worker process per rank hosting the actor, the rollout engine and the reference (the
    engine in processes of its own with ``hybrid_engine=false``)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """the policy model"""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """the trained policy"""
    ref: RefConfig = field(default_factory=RefConfig)
    """the reference policy (loaded when a KL term needs it)"""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """the generation engine"""
    hybrid_engine: bool = True
    """the engine in the actor's processes, weights pushed in memory; `false`: the engines on GPUs of
    their own (`rollout.nnodes` x `rollout.n_gpus_per_node`), weights broadcast from the actor after
    each update (docs/architecture.md, Split pools)"""
