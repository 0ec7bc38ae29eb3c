"""Settings of the PPO critic (``critic``, used with ``algorithm.adv_estimator=gae``).

Defaults that follow the actor are interpolations of its keys, as in Search-R1's YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import II

from verl.utils.model_config import FSDPConfig, ModelSource, OptimConfig

VALUE_HEAD_INITS = ("zero", "random")  # critic.model.value_head_init


@dataclass(frozen=True)
class CriticModelConfig(ModelSource):
    """The value model: a causal-LM checkpoint whose body gets a one-unit head (``critic.model``)."""

    path: str = II("actor_rollout_ref.model.path")
    """value model initialisation (a scalar head is added)"""
    tokenizer_path: Optional[str] = II("actor_rollout_ref.model.path")
    """its tokenizer"""
    external_lib: Optional[str] = II("actor_rollout_ref.model.external_lib")
    """module to import first (custom architectures)"""
    attn_implementation: Optional[str] = II("actor_rollout_ref.model.attn_implementation")
    """attention kernel (see the actor's key)"""
    enable_gradient_checkpointing: bool = True
    """activation checkpointing"""
    use_remove_padding: bool = True
    """packed (padding-free) forward passes"""
    max_packed_row_len: int = II("actor_rollout_ref.model.max_packed_row_len")
    """tokens per packed row (see the actor's key)"""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """sharding and offload of the critic"""
    value_head_init: str = "zero"
    """a value head the checkpoint lacks starts at `zero` (every value 0: the first advantages are the
    returns, whitened) or `random` (transformers' init, as veRL's). A random head gives each token
    type its own value, the same in every sample, so its first advantages push token types up or
    down whatever the reward (docs/benchmarks_learning.md, "PPO one-step off-policy"). A head found
    in the checkpoint is loaded either way"""


@dataclass(frozen=True)
class CriticConfig:
    """Value-model training: batch sizes (prompts x ``rollout.n`` rows), the clipped value loss."""

    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """the value model"""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1.0e-5, lr_warmup_steps_ratio=0.05))
    """AdamW and schedule of the critic"""
    ppo_mini_batch_size: int = II("actor_rollout_ref.actor.ppo_mini_batch_size")
    """prompts per critic optimizer step"""
    ppo_micro_batch_size: Optional[int] = 8
    """global rows per micro-batch (split over ranks)"""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """rows per micro-batch per rank; wins over the global one"""
    forward_micro_batch_size: Optional[int] = II(".ppo_micro_batch_size")
    """global rows per value forward"""
    forward_micro_batch_size_per_gpu: Optional[int] = None
    """rows per value forward per rank; wins over the global one (neither set: the update's micro-batch)"""
    use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """token-count micro-batches"""
    ppo_max_token_len_per_gpu: int = 32768
    """token budget per update micro-batch"""
    forward_max_token_len_per_gpu: int = II(".ppo_max_token_len_per_gpu")
    """token budget per forward micro-batch"""
    ppo_epochs: int = II("actor_rollout_ref.actor.ppo_epochs")
    """passes per batch"""
    use_torch_compile: bool = II("actor_rollout_ref.actor.use_torch_compile")
    """on a GPU, `torch.compile` each decoder layer of the value model, as the actor's (the first step
    pays the compilation); ignored on CPU"""
    shuffle: bool = II("actor_rollout_ref.actor.shuffle")
    """shuffle rows between mini-batches"""
    grad_clip: Optional[float] = 1.0
    """max gradient norm (`null`: no clipping)"""
    cliprange_value: float = 0.5
    """value clipping range of the PPO value loss"""
    loss_agg_mode: str = II("actor_rollout_ref.actor.loss_agg_mode")
    """value loss aggregation"""
