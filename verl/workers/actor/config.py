"""Settings of the PPO actor (``actor_rollout_ref.actor``): batch sizes, the loss, its optimizer.

Read by :class:`verl.workers.actor.dp_actor.DataParallelPPOActor` and the actor worker. Batch sizes
are global and counted in prompts (each expands to ``rollout.n`` rows), except ``*_per_gpu``; the
per-rank numbers are derived by :func:`verl.workers.batching.actor_update_batching`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from verl.utils.model_config import FSDPConfig, OptimConfig


@dataclass(frozen=True)
class PolicyLossConfig:
    """Which registered policy loss the actor minimises (``actor.policy_loss``)."""

    loss_mode: str = "vanilla"
    """policy loss from the registry (`vanilla` clipped PPO, `gspo`, ... see `verl/algorithms/policy_loss.py`)"""


@dataclass(frozen=True)
class LLDSConfig:
    """The likelihood-preserving regulariser of the actor loss (``actor.llds``; Deng et al. 2026,
    arXiv:2512.04220; ``verl/algorithms/llds.py``). Off by default."""

    coef: float = 0.0
    """lambda: weight of the LLDS term in the actor loss (0: off; the authors' script uses 0.2). It acts
    only where an update already moved the policy: from the second mini-batch or epoch of a step on"""
    gate: str = "action"
    """`action`: each action (model text between observations) whose likelihood fell is regularised (the
    paper's best, A-gate); `response`: the whole response's (R-gate)"""


@dataclass(frozen=True)
class ActorConfig:
    """The trainable policy: PPO epochs, micro-batching, the clipped loss, KL and entropy terms."""

    ppo_mini_batch_size: int = 256
    """prompts per optimizer step (x `rollout.n` rows)"""
    ppo_micro_batch_size: Optional[int] = 64
    """global rows per forward/backward micro-batch, split over the ranks (Search-R1's key)"""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """rows per micro-batch per rank (veRL's key); wins over the global one"""
    use_dynamic_bsz: bool = False
    """pack micro-batches by token count (`ppo_max_token_len_per_gpu`) instead of rows"""
    ppo_max_token_len_per_gpu: int = 16384
    """token budget per micro-batch with dynamic batch size"""
    grad_clip: Optional[float] = 1.0
    """max global gradient norm (`null`: no clipping)"""
    clip_ratio: float = 0.2
    """PPO clip epsilon (Schulman et al. 2017); default of the low/high bounds"""
    clip_ratio_low: Optional[float] = 0.2
    """lower clip epsilon (ratio >= 1 - eps_low); `null`: `clip_ratio`"""
    clip_ratio_high: Optional[float] = 0.2
    """upper clip epsilon (ratio <= 1 + eps_high; DAPO's clip-higher when larger); `null`: `clip_ratio`"""
    clip_ratio_c: float = 3.0
    """dual-clip constant for negative advantages (Ye et al. 2020), > 1"""
    entropy_coeff: float = 0.001
    """entropy bonus weight"""
    use_kl_loss: bool = False
    """KL(actor || ref) as a loss term (GRPO's placement); needs the reference policy"""
    kl_loss_coef: float = 0.001
    """weight of the KL loss"""
    kl_loss_type: str = "low_var_kl"
    """KL estimator of the loss: `kl` (k1), `abs`, `mse` (k2), `low_var_kl` (k3), `full`"""
    loss_agg_mode: str = "token-mean"
    """loss aggregation: `token-mean`, `seq-mean-token-sum`, `seq-mean-token-mean`, `seq-mean-token-sum-norm`"""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """the policy loss"""
    llds: LLDSConfig = field(default_factory=LLDSConfig)
    """lazy-likelihood-displacement regulariser (GRPO collapse in agent search)"""
    tis_imp_ratio_cap: float = -1.0
    """truncated importance sampling: cap on pi_old / pi_rollout (> 0 enables; needs `rollout_log_probs`)"""
    tis_level: str = "token"
    """TIS ratio per `token` or per `sequence`"""
    tis_mode: str = "truncate"
    """TIS weights `truncate`d at the cap, or `mask`ed (dropped) above it"""
    ppo_epochs: int = 1
    """passes over each batch"""
    skip_old_log_prob_on_policy: bool = True
    """with one epoch, one mini-batch per step (`ppo_mini_batch_size == data.train_batch_size`), no
    in-reward KL and no TIS the update is exactly on-policy: skip the separate `old_log_probs` pass and
    use the update's own log-probs, detached (ratio 1, same gradient; `actor/ppo_kl` and
    `actor/pg_clipfrac` then read 0)"""
    use_torch_compile: bool = True
    """on a GPU, `torch.compile` the per-chunk log-prob/entropy math and each decoder layer of the
    actor and reference (the first step pays ~1 min of compilation); ignored on CPU; the actor's
    layers stay eager when the transformers rollout generates with them, and LoRA models stay eager"""
    shuffle: bool = False
    """shuffle rows between mini-batches (a fixed permutation per epoch)"""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1.0e-6, lr_warmup_steps_ratio=0.95))
    """AdamW and schedule of the actor (Search-R1 PPO warms up over 95% of the run; GRPO 28.5%)"""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """sharding and offload of the actor"""
