"""Start-up checks of the trainer configuration, run before any model is loaded.

Two kinds of mistakes are caught here rather than an hour into a run:

* a value whose type disagrees with the default in ``ppo_trainer.yaml`` (``trainer.total_epochs=abc``).
  Hydra's struct mode already rejects unknown keys; plain YAML carries no types, so we compare
  every leaf with the default's type (ints are accepted for floats, anything for a ``null`` default).
* batch sizes that do not divide: train batch by mini-batch, (mini-batch x n) by micro-batch,
  micro-batch by the data-parallel size, and the same for the critic and log-prob passes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "config" / "ppo_trainer.yaml"

ADV_ESTIMATORS_NEEDING_CRITIC = {"gae"}
ADV_ESTIMATORS_NEEDING_GROUPS = {"grpo", "rloo", "grpo_passk", "opo"}


def load_default_config() -> DictConfig:
    return OmegaConf.load(DEFAULT_CONFIG)


def _leaves(cfg: Any, prefix: str = ""):
    """(dotted key, value) for every leaf of a config, without resolving interpolations."""
    if isinstance(cfg, DictConfig):
        for key in cfg.keys():
            node = cfg._get_node(key)
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(node, (DictConfig, ListConfig)) and not node._is_interpolation():
                if isinstance(node, ListConfig):
                    yield dotted, node
                else:
                    yield from _leaves(node, dotted)
            else:
                yield dotted, node


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple, ListConfig)):
        return "list"
    if isinstance(value, (dict, DictConfig)):
        return "dict"
    return type(value).__name__


def _compatible(expected: str, got: str) -> bool:
    return expected == got or (expected == "float" and got == "int")


def _under_null_default(defaults: DictConfig, key: str) -> bool:
    """Whether some parent of dotted ``key`` is null in the defaults (a free-form value)."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        parent = OmegaConf.select(defaults, ".".join(parts[:end]), throw_on_missing=False, default="<absent>")
        if parent is None:
            return True
        if not (isinstance(parent, str) and parent == "<absent>"):
            return False
    return False


def check_types(cfg: DictConfig, defaults: DictConfig | None = None) -> None:
    """Compare every leaf of ``cfg`` with the default config.

    Raises:
        ValueError: a key absent from the defaults (e.g. added with ``+key=``), or a value whose
            type differs from the default's, naming the key, the value and the expected type.
    """
    defaults = defaults if defaults is not None else load_default_config()
    errors = []
    for key, node in _leaves(cfg):
        default_node = OmegaConf.select(defaults, key, throw_on_missing=False, default="<absent>")
        if isinstance(default_node, str) and default_node == "<absent>":
            if _under_null_default(defaults, key):
                continue  # a null default accepts any value, a mapping included (trainer.worker_env_vars)
            errors.append(f"{key}: unknown key (not in {DEFAULT_CONFIG.name})")
            continue
        value = OmegaConf.select(cfg, key)
        if default_node is None or value is None:
            continue
        expected, got = _type_name(default_node), _type_name(value)
        if not _compatible(expected, got):
            errors.append(f"{key}: expected {expected}, got {got} {value!r}")
    if errors:
        raise ValueError("invalid configuration:\n  " + "\n  ".join(errors))


def rollout_n(cfg: DictConfig) -> int:
    """Responses per prompt: ``rollout.n`` (veRL), or Search-R1's ``rollout.n_agent`` when n is 1.

    Raises:
        ValueError: both are set above 1 and disagree.
    """
    n, n_agent = int(cfg.actor_rollout_ref.rollout.n), int(cfg.actor_rollout_ref.rollout.n_agent)
    if n > 1 and n_agent > 1 and n != n_agent:
        raise ValueError(f"actor_rollout_ref.rollout.n={n} and rollout.n_agent={n_agent} disagree; set only one")
    return max(n, n_agent)


def data_parallel_size(cfg: DictConfig) -> int:
    return int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)


def _divides(errors: list, big_name: str, big: int, small_name: str, small: int) -> None:
    if small <= 0 or big % small != 0:
        errors.append(f"{big_name} ({big}) is not divisible by {small_name} ({small})")


def _check_micro(errors: list, name: str, rows: int, rows_name: str, micro_global, micro_per_gpu, dp: int) -> None:
    """Rows of a mini-batch split into micro-batches of ``micro_per_gpu`` on each of ``dp`` ranks."""
    if micro_per_gpu is not None:
        _divides(errors, rows_name, rows, f"{name}_per_gpu x data-parallel size ({micro_per_gpu} x {dp})",
                 int(micro_per_gpu) * dp)
        return
    _divides(errors, rows_name, rows, name, int(micro_global))
    _divides(errors, name, int(micro_global), "data-parallel size (nnodes x n_gpus_per_node)", dp)


def check_batch_sizes(cfg: DictConfig) -> None:
    """Batch-size arithmetic. Sizes are in prompts (x ``rollout.n`` rows); ``*_micro_batch_size`` is
    global (Search-R1) and ``*_micro_batch_size_per_gpu`` (veRL) takes precedence when set.

    Raises:
        ValueError: listing every pair of numbers that disagree.
    """
    errors: list[str] = []
    n, dp = rollout_n(cfg), data_parallel_size(cfg)
    train = int(cfg.data.train_batch_size)
    actor = cfg.actor_rollout_ref.actor
    mini = int(actor.ppo_mini_batch_size)
    _divides(errors, "data.train_batch_size", train, "actor.ppo_mini_batch_size", mini)
    _divides(errors, f"data.train_batch_size x rollout.n rows ({train} x {n})", train * n, "data-parallel size", dp)
    if not actor.use_dynamic_bsz:
        _check_micro(errors, "actor.ppo_micro_batch_size", mini * n,
                     f"actor.ppo_mini_batch_size x rollout.n rows ({mini} x {n})",
                     actor.ppo_micro_batch_size, actor.ppo_micro_batch_size_per_gpu, dp)
        for part in ("rollout", "ref"):
            node = cfg.actor_rollout_ref[part]
            if node.log_prob_micro_batch_size_per_gpu is None:
                _divides(errors, f"{part}.log_prob_micro_batch_size", int(node.log_prob_micro_batch_size),
                         "data-parallel size", dp)
    if needs_critic(cfg):
        critic = cfg.critic
        critic_mini = int(critic.ppo_mini_batch_size)
        _divides(errors, "data.train_batch_size", train, "critic.ppo_mini_batch_size", critic_mini)
        if not critic.use_dynamic_bsz:
            _check_micro(errors, "critic.ppo_micro_batch_size", critic_mini * n,
                         f"critic.ppo_mini_batch_size x rollout.n rows ({critic_mini} x {n})",
                         critic.ppo_micro_batch_size, critic.ppo_micro_batch_size_per_gpu, dp)
    if errors:
        raise ValueError("batch sizes disagree:\n  " + "\n  ".join(errors))


def on_policy_update(cfg: DictConfig) -> bool:
    """True when the actor update may take ``old_log_probs`` from its own forward pass.

    With one PPO epoch and one mini-batch per step, the update runs on the parameters that
    generated the batch, so the recomputed ``old_log_probs`` equal the update's log-probs: the ratio
    is 1 and the clipped objective's gradient is the plain policy gradient. Needs
    ``actor.skip_old_log_prob_on_policy``, and nothing else that reads ``old_log_probs`` (the
    in-reward KL, truncated importance sampling against the rollout's log-probs).
    """
    actor = cfg.actor_rollout_ref.actor
    return (bool(actor.get("skip_old_log_prob_on_policy", False)) and int(actor.ppo_epochs) == 1
            and int(actor.ppo_mini_batch_size) == int(cfg.data.train_batch_size)
            and not cfg.algorithm.use_kl_in_reward and float(actor.get("tis_imp_ratio_cap", -1) or -1) <= 0)


def needs_critic(cfg: DictConfig) -> bool:
    return cfg.algorithm.adv_estimator in ADV_ESTIMATORS_NEEDING_CRITIC


def check_algorithm(cfg: DictConfig) -> None:
    """Choices that only make sense together.

    Raises:
        ValueError: a group estimator with one response per prompt, or a bad enum value.
    """
    estimator = cfg.algorithm.adv_estimator
    if estimator in ADV_ESTIMATORS_NEEDING_GROUPS and rollout_n(cfg) < 2:
        raise ValueError(f"algorithm.adv_estimator={estimator} needs groups: set actor_rollout_ref.rollout.n >= 2 "
                         f"(got {rollout_n(cfg)})")
    choices = {
        "trainer.backend": ("ray", "local"),
        "actor_rollout_ref.rollout.name": ("vllm", "hf"),
        "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
        "actor_rollout_ref.actor.loss_agg_mode": ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                                  "seq-mean-token-sum-norm"),
    }
    for key, allowed in choices.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise ValueError(f"{key}={value!r}: choose one of {list(allowed)}")
    if cfg.trainer.resume_mode not in ("auto", "disable") and not Path(cfg.trainer.resume_mode).exists():
        raise ValueError(f"trainer.resume_mode={cfg.trainer.resume_mode!r}: expected auto, disable or an "
                         f"existing checkpoint folder")


def check_config(cfg: DictConfig, defaults: DictConfig | None = None) -> None:
    """All start-up checks; raises ValueError naming the offending key(s)."""
    check_types(cfg, defaults)
    check_algorithm(cfg)
    check_batch_sizes(cfg)
