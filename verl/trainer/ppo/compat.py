"""Keys that Search-R1's scripts and YAML pass but that have no effect here, in one place.

They stay accepted at their Search-R1 paths, so those scripts run unchanged; :func:`pop_compat_keys`
takes them out of the tree before it is typed and logs one warning for each one set to a value
other than its default (a user who sets one learns that it did nothing). The generated
``ppo_trainer.yaml`` lists them with their defaults; docs/configuration.md has their table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.utils.config import delete_key

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompatKey:
    """A Search-R1/veRL key without effect: its default and why it has none.

    A default written ``${other.key}`` means "the value of that key" (no warning when they agree).
    """

    default: Any
    why: str


_SHARDING = "FSDP2 shards each decoder layer over all ranks; no auto-wrap threshold or shard group"
_ULYSSES = "no sequence parallelism: each rank holds whole sequences"

COMPAT_KEYS: dict[str, CompatKey] = {
    "actor_rollout_ref.actor.strategy": CompatKey("fsdp", "FSDP2 is the only training backend"),
    "actor_rollout_ref.actor.state_masking": CompatKey(
        True, "retrieved tokens are always masked out of the loss (`response_mask` comes from the loop)"),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": CompatKey(1, _ULYSSES),
    "actor_rollout_ref.actor.optim.total_training_steps": CompatKey(
        -1, "the schedule length is the run's: `trainer.total_training_steps` or epochs x batches"),
    "actor_rollout_ref.actor.fsdp_config.grad_offload": CompatKey(
        True, "gradients live with the parameters: `param_offload` and `offload_policy` place both"),
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": CompatKey(-1, _SHARDING),
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params": CompatKey(0, _SHARDING),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": CompatKey(1, _ULYSSES),
    "actor_rollout_ref.ref.fsdp_config.fsdp_size": CompatKey(-1, _SHARDING),
    "actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params": CompatKey(0, _SHARDING),
    "actor_rollout_ref.rollout.prompt_length": CompatKey(
        "${data.max_prompt_length}", "the loop's context budget is `data.max_prompt_length`"),
    "actor_rollout_ref.rollout.response_length": CompatKey(
        "${data.max_response_length}", "the per-turn budget is `data.max_response_length`"),
    "actor_rollout_ref.rollout.ignore_eos": CompatKey(
        False, "training stops at EOS and the stop strings; benchmarks set `ignore_eos` on the engine"),
    "actor_rollout_ref.rollout.load_format": CompatKey(
        "dummy_dtensor", "the engine loads `model.path`; the actor's weights are pushed after each update"),
    "critic.strategy": CompatKey("fsdp", "FSDP2 is the only training backend"),
    "critic.ulysses_sequence_parallel_size": CompatKey(1, _ULYSSES),
    "critic.optim.total_training_steps": CompatKey(
        -1, "the schedule length is the run's: `trainer.total_training_steps` or epochs x batches"),
    "critic.model.fsdp_config.grad_offload": CompatKey(
        True, "gradients live with the parameters: `param_offload` and `offload_policy` place both"),
    "critic.model.fsdp_config.fsdp_size": CompatKey(-1, _SHARDING),
    "critic.model.fsdp_config.wrap_policy.min_num_params": CompatKey(0, _SHARDING),
    "data.return_raw_input_ids": CompatKey(False, "no learned reward model with another tokenizer"),
    "reward_model.enable": CompatKey(False, "rewards are rule-based (EM); no learned reward model"),
    "reward_model.reward_manager": CompatKey("naive", "one reward manager: one score per row on its last token"),
    "algorithm.no_think_rl": CompatKey(False, "Search-R1 ablation switch; its own trainer stops with an error when true"),
    "algorithm.state_masking.start_state_marker": CompatKey(
        "<information>", "the loop masks the observation tokens it appends itself"),
    "algorithm.state_masking.end_state_marker": CompatKey(
        "</information>", "the loop masks the observation tokens it appends itself"),
    "trainer.default_hdfs_dir": CompatKey(None, "no HDFS copy; checkpoints stay in `trainer.default_local_dir`"),
    "trainer.max_critic_ckpt_to_keep": CompatKey(
        None, "checkpoints are pruned as whole step folders by `trainer.max_actor_ckpt_to_keep`"),
}

_ABSENT = object()


def _default_value(tree: DictConfig, compat: CompatKey) -> Any:
    default = compat.default
    if isinstance(default, str) and default.startswith("${") and default.endswith("}"):
        return OmegaConf.select(tree, default[2:-1], default=None)
    return default


def pop_compat_keys(cfg: DictConfig | dict) -> DictConfig:
    """A copy of ``cfg`` without the keys of :data:`COMPAT_KEYS`; warns once per key set to a
    non-default value. Emptied parents (e.g. ``algorithm.state_masking``) are removed too."""
    tree = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg)
    for key, compat in COMPAT_KEYS.items():
        value = OmegaConf.select(tree, key, default=_ABSENT, throw_on_missing=False)
        if value is _ABSENT:
            continue
        if value != _default_value(tree, compat):
            logger.warning("%s=%r has no effect here: %s", key, value, compat.why)
        delete_key(tree, key)
    return tree
