"""Settings of the advantage estimator and the in-reward KL (``algorithm``).

Names are checked against the registries of :mod:`verl.algorithms` at start.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KLControlConfig:
    """The in-reward KL coefficient beta and how it moves (``algorithm.kl_ctrl``)."""

    type: str = "fixed"
    """`fixed` or `adaptive` (Ziegler et al. 2019)"""
    kl_coef: float = 0.001
    """(initial) beta"""
    horizon: int = 10000
    """adaptive controller horizon"""
    target_kl: float = 0.1
    """adaptive controller target"""


@dataclass(frozen=True)
class AlgorithmConfig:
    """Advantages and rewards."""

    gamma: float = 1.0
    """discount"""
    lam: float = 1.0
    """GAE lambda (Schulman et al. 2016)"""
    adv_estimator: str = "gae"
    """registered estimator: `gae` (PPO with critic), `grpo` (Shao et al. 2024), `rloo`, `reinforce` (Williams
    1992, no baseline; Search-R1++), `reinforce_plus_plus`, `reinforce_plus_plus_baseline`"""
    norm_adv_by_std_in_grpo: bool = True
    """divide GRPO advantages by the group std (`false`: Dr. GRPO)"""
    use_kl_in_reward: bool = True
    """subtract beta * KL(actor || ref) from the token rewards (PPO's placement); needs the reference"""
    kl_penalty: str = "kl"
    """estimator of the in-reward KL (`kl`, `abs`, `mse`, `low_var_kl`, `full`)"""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """the KL coefficient"""
