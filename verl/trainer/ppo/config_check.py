"""Start-up checks of a typed ``PPOConfig`` and the values derived from it, before any model loads.

Types and unknown keys are OmegaConf's job (:func:`verl.utils.config.to_typed`). What is left are
values that only make sense together: algorithm names against their registries (and each entry's
own requirements: a critic, groups, an aggregation mode), batch sizes that must split over ranks and
micro-batches (:mod:`verl.workers.batching`, the functions the workers use), token budgets against
the engine length, and choices among fixed names. Every message names the key(s) and numbers.
"""

from __future__ import annotations

from pathlib import Path

from verl import algorithms
from verl.trainer.ppo.config import BACKENDS, PPOConfig, environment_of
from verl.trainer.ppo.health import health_rules
from verl.utils.config import ConfigError
from verl.workers import batching
from verl.workers.critic.config import VALUE_HEAD_INITS
from verl.workers.rollout.config import ENGINE_NAMES, ROLLOUT_MODES, engine_max_model_len


def rollout_n(cfg: PPOConfig) -> int:
    """Responses per prompt: ``rollout.n`` (veRL), or Search-R1's ``rollout.n_agent`` when n is 1.

    Raises:
        ConfigError: both are set above 1 and disagree.
    """
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.n > 1 and rollout.n_agent > 1 and rollout.n != rollout.n_agent:
        raise ConfigError(f"actor_rollout_ref.rollout.n={rollout.n} and rollout.n_agent={rollout.n_agent} "
                          f"disagree; set only one")
    return max(rollout.n, rollout.n_agent)


def data_parallel_size(cfg: PPOConfig) -> int:
    """Ranks of the run: ``trainer.nnodes x trainer.n_gpus_per_node``."""
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def needs_critic(cfg: PPOConfig) -> bool:
    """Whether the advantage estimator reads critic values (registry entry's ``needs_critic``)."""
    return algorithms.get_adv_estimator(cfg.algorithm.adv_estimator).needs_critic


def needs_reference(cfg: PPOConfig) -> bool:
    """A reference policy is needed when KL enters the reward or the actor loss."""
    return cfg.algorithm.use_kl_in_reward or cfg.actor_rollout_ref.actor.use_kl_loss


def on_policy_update(cfg: PPOConfig) -> bool:
    """True when the actor update may take ``old_log_probs`` from its own forward pass.

    With one PPO epoch and one mini-batch per step, the update runs on the parameters that
    generated the batch, so the recomputed ``old_log_probs`` equal the update's log-probs: the ratio
    is 1 and the clipped objective's gradient is the plain policy gradient. Needs
    ``actor.skip_old_log_prob_on_policy``, and nothing else that reads ``old_log_probs`` (the
    in-reward KL, truncated importance sampling against the rollout's log-probs).
    """
    actor = cfg.actor_rollout_ref.actor
    return (actor.skip_old_log_prob_on_policy and actor.ppo_epochs == 1
            and actor.ppo_mini_batch_size == cfg.data.train_batch_size
            and not cfg.algorithm.use_kl_in_reward and actor.tis_imp_ratio_cap <= 0)


def rollout_log_probs(cfg: PPOConfig) -> bool:
    """True when the rollout returns the engine's log-probs: truncated importance sampling reads them
    (``actor.tis_imp_ratio_cap`` > 0), or ``rollout.calculate_log_probs`` asks for them."""
    return cfg.actor_rollout_ref.rollout.calculate_log_probs or cfg.actor_rollout_ref.actor.tis_imp_ratio_cap > 0


def _choose(errors: list[str], key: str, value, allowed) -> None:
    if value not in allowed:
        errors.append(f"{key}={value!r}: choose one of {sorted(allowed)}")


def check_algorithm(cfg: PPOConfig) -> None:
    """Algorithm names against the registries of :mod:`verl.algorithms`, and their requirements.

    Raises:
        ConfigError: listing every unknown name, a group estimator with ``n < 2``, or a loss
            aggregation the policy loss is not defined for.
    """
    errors: list[str] = []
    actor = cfg.actor_rollout_ref.actor
    _choose(errors, "algorithm.adv_estimator", cfg.algorithm.adv_estimator, algorithms.ADV_ESTIMATOR_REGISTRY)
    _choose(errors, "actor_rollout_ref.actor.policy_loss.loss_mode", actor.policy_loss.loss_mode,
            algorithms.POLICY_LOSS_REGISTRY)
    _choose(errors, "algorithm.kl_penalty", cfg.algorithm.kl_penalty, algorithms.KL_ESTIMATORS)
    _choose(errors, "actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type, algorithms.KL_ESTIMATORS)
    _choose(errors, "algorithm.kl_ctrl.type", cfg.algorithm.kl_ctrl.type, algorithms.KL_CONTROLLERS)
    _choose(errors, "actor_rollout_ref.actor.loss_agg_mode", actor.loss_agg_mode, algorithms.LOSS_AGG_MODES)
    _choose(errors, "critic.loss_agg_mode", cfg.critic.loss_agg_mode, algorithms.LOSS_AGG_MODES)
    _choose(errors, "actor_rollout_ref.actor.tis_level", actor.tis_level, algorithms.TIS_LEVELS)
    _choose(errors, "actor_rollout_ref.actor.tis_mode", actor.tis_mode, algorithms.TIS_MODES)
    _choose(errors, "actor_rollout_ref.actor.llds.gate", actor.llds.gate, algorithms.LLDS_GATES)
    if errors:
        raise ConfigError("invalid algorithm settings:\n  " + "\n  ".join(errors))
    estimator = algorithms.get_adv_estimator(cfg.algorithm.adv_estimator)
    if estimator.needs_groups and rollout_n(cfg) < 2:
        raise ConfigError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} needs groups: set "
                          f"actor_rollout_ref.rollout.n >= 2 (got {rollout_n(cfg)})")
    allowed = algorithms.get_policy_loss(actor.policy_loss.loss_mode).loss_agg_modes
    if allowed is not None and actor.loss_agg_mode not in allowed:
        raise ConfigError(f"actor_rollout_ref.actor.loss_agg_mode={actor.loss_agg_mode!r} is not defined for "
                          f"policy_loss.loss_mode={actor.policy_loss.loss_mode!r}; choose one of {list(allowed)}")
    if actor.clip_ratio_c <= 1.0:
        raise ConfigError(f"actor_rollout_ref.actor.clip_ratio_c={actor.clip_ratio_c} must be > 1 (dual clip)")
    check_llds(cfg)


def check_llds(cfg: PPOConfig) -> None:
    """LLDS (``actor.llds``) needs an update that moves the policy before it reads log-probs again:
    with one epoch over one mini-batch the old and current log-probs are equal and the term is 0.

    Raises:
        ConfigError: a negative coefficient, or LLDS on with a single update per step.
    """
    actor = cfg.actor_rollout_ref.actor
    if actor.llds.coef < 0:
        raise ConfigError(f"actor_rollout_ref.actor.llds.coef={actor.llds.coef} must be >= 0 (0: off)")
    if actor.llds.coef > 0 and actor.ppo_epochs == 1 and actor.ppo_mini_batch_size >= cfg.data.train_batch_size:
        raise ConfigError(
            f"actor_rollout_ref.actor.llds.coef={actor.llds.coef} has no effect with one update per step "
            f"(ppo_epochs=1, ppo_mini_batch_size={actor.ppo_mini_batch_size} >= data.train_batch_size="
            f"{cfg.data.train_batch_size}): the likelihood it guards has not moved yet; set "
            f"actor_rollout_ref.actor.ppo_mini_batch_size < data.train_batch_size or ppo_epochs > 1")


def _collect(errors: list[str], build, *args) -> None:
    try:
        build(*args)
    except ValueError as error:
        errors.append(str(error))


def check_batch_sizes(cfg: PPOConfig) -> None:
    """Batch-size arithmetic, with the per-rank split the workers will make.

    Sizes are in prompts (x ``rollout.n`` rows); ``*_micro_batch_size`` is global (Search-R1) and
    ``*_micro_batch_size_per_gpu`` (veRL) wins when set.

    Raises:
        ConfigError: listing every pair of numbers that disagree.
    """
    errors: list[str] = []
    n, dp = rollout_n(cfg), data_parallel_size(cfg)
    train = cfg.data.train_batch_size
    node = cfg.actor_rollout_ref
    if train % node.actor.ppo_mini_batch_size:
        errors.append(f"data.train_batch_size ({train}) is not divisible by actor.ppo_mini_batch_size "
                      f"({node.actor.ppo_mini_batch_size})")
    if (train * n) % dp:
        errors.append(f"data.train_batch_size x rollout.n rows ({train} x {n}) is not divisible by data-parallel "
                      f"size ({dp})")
    _collect(errors, batching.actor_update_batching, node.actor, n, dp)
    _collect(errors, batching.log_prob_batching, "rollout", node.rollout, node.actor, dp)
    if needs_reference(cfg):
        _collect(errors, batching.log_prob_batching, "ref", node.ref, node.actor, dp)
    if needs_critic(cfg):
        if train % cfg.critic.ppo_mini_batch_size:
            errors.append(f"data.train_batch_size ({train}) is not divisible by critic.ppo_mini_batch_size "
                          f"({cfg.critic.ppo_mini_batch_size})")
        _collect(errors, batching.critic_batching, cfg.critic, n, dp)
    if errors:
        raise ConfigError("batch sizes disagree:\n  " + "\n  ".join(errors))


def check_choices(cfg: PPOConfig) -> None:
    """Fixed names (backend, engine, rollout mode), the resume target and the engine length.

    Raises:
        ConfigError: naming the key and the allowed values.
    """
    errors: list[str] = []
    _choose(errors, "trainer.backend", cfg.trainer.backend, BACKENDS)
    _choose(errors, "actor_rollout_ref.rollout.name", cfg.actor_rollout_ref.rollout.name, ENGINE_NAMES)
    _choose(errors, "actor_rollout_ref.rollout.mode", cfg.actor_rollout_ref.rollout.mode, ROLLOUT_MODES)
    _choose(errors, "critic.model.value_head_init", cfg.critic.model.value_head_init, VALUE_HEAD_INITS)
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    resume = cfg.trainer.resume_mode
    if resume not in ("auto", "disable") and not Path(resume).exists():
        raise ConfigError(f"trainer.resume_mode={resume!r}: expected auto, disable or an existing checkpoint folder")
    try:
        engine_max_model_len(cfg.actor_rollout_ref.rollout, cfg.data)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def check_sampling(cfg: PPOConfig) -> None:
    """Sampling settings that contradict each other.

    Validation is greedy by default (``val_kwargs.do_sample=false``, ``val_kwargs.temperature=0``,
    veRL's defaults); ``do_sample=true`` with a temperature of 0 would still decode greedily, so a
    user who asked for sampling would silently get greedy results. The training temperature also
    divides the logits of the log-prob passes, so it must be positive even when training is greedy.

    Raises:
        ConfigError: naming the key to set.
    """
    rollout = cfg.actor_rollout_ref.rollout
    val = rollout.val_kwargs
    if val.do_sample and val.temperature <= 0:
        raise ConfigError(f"actor_rollout_ref.rollout.val_kwargs.do_sample=true samples nothing with "
                          f"val_kwargs.temperature={val.temperature}: set "
                          f"actor_rollout_ref.rollout.val_kwargs.temperature > 0 (e.g. 1.0)")
    if rollout.temperature <= 0:
        raise ConfigError(f"actor_rollout_ref.rollout.temperature={rollout.temperature} must be > 0 (it divides "
                          f"the logits of the log-prob passes); for greedy training set "
                          f"actor_rollout_ref.rollout.do_sample=false")


def check_trainer_watch(cfg: PPOConfig) -> None:
    """``trainer.keep_best`` names a validation metric that is computed, and ``trainer.health`` is
    well formed (its threshold overrides name known signals).

    Raises:
        ConfigError: naming the key.
    """
    trainer = cfg.trainer
    if trainer.keep_best is not None:
        if not trainer.keep_best.startswith("val/"):
            raise ConfigError(f"trainer.keep_best={trainer.keep_best!r}: name a validation metric, e.g. "
                              f"val/test_em/all or val/test_score/<data_source>")
        if trainer.test_freq <= 0:
            raise ConfigError(f"trainer.keep_best={trainer.keep_best} needs validation: set trainer.test_freq > 0 "
                              f"(got {trainer.test_freq})")
    health = trainer.health
    if health.baseline_steps < 1 or health.patience < 1:
        raise ConfigError(f"trainer.health.baseline_steps={health.baseline_steps} and trainer.health.patience="
                          f"{health.patience} must be >= 1")
    try:
        health_rules(environment_of(cfg).health_rules, health.thresholds)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def check_staleness(cfg: PPOConfig) -> None:
    """``rollout.staleness=1`` (a step's rollout overlapping the previous step's training) needs an
    engine apart from the actor's parameters, resident through the update, and the importance
    weights that correct the one-update lag (Yao et al. 2025's truncated IS; decoupled PPO).

    Raises:
        ConfigError: naming the setting that does not fit.
    """
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    key = "actor_rollout_ref.rollout.staleness"
    if rollout.staleness not in (0, 1):
        raise ConfigError(f"{key}={rollout.staleness}: choose 0 (on-policy) or 1 (the next rollout beside the update)")
    if rollout.staleness == 0:
        return
    if rollout.name != "vllm":
        raise ConfigError(f"{key}=1 needs actor_rollout_ref.rollout.name=vllm (the hf engine generates with the "
                          f"actor's own parameters, which the update changes); got {rollout.name!r}")
    if rollout.free_cache_engine and cfg.actor_rollout_ref.hybrid_engine:
        raise ConfigError(f"{key}=1 keeps the engine generating through the update: set "
                          f"actor_rollout_ref.rollout.free_cache_engine=false")
    if actor.tis_imp_ratio_cap <= 0:
        raise ConfigError(f"{key}=1 trains on a batch sampled one update earlier: set "
                          f"actor_rollout_ref.actor.tis_imp_ratio_cap > 0 (e.g. 2.0) to correct it")


def check_split_pools(cfg: PPOConfig) -> None:
    """``actor_rollout_ref.hybrid_engine=false`` puts the engines on ``rollout.nnodes x
    rollout.n_gpus_per_node`` ranks of their own; the two keys must agree, and the pools need Ray.

    Raises:
        ConfigError: naming the setting that does not fit.
    """
    hybrid, pool = cfg.actor_rollout_ref.hybrid_engine, cfg.rollout
    rollout = cfg.actor_rollout_ref.rollout
    tp = rollout.tensor_model_parallel_size if rollout.name == "vllm" else 1  # one hf engine per rank
    if hybrid:
        if pool.n_gpus_per_node:
            raise ConfigError(f"rollout.n_gpus_per_node={pool.n_gpus_per_node} gives the engines GPUs of their own: "
                              f"set actor_rollout_ref.hybrid_engine=false too (or rollout.n_gpus_per_node=0)")
        return
    if pool.n_gpus_per_node < 1 or pool.nnodes < 1:
        raise ConfigError(f"actor_rollout_ref.hybrid_engine=false needs the engines' own GPUs: rollout.nnodes="
                          f"{pool.nnodes} x rollout.n_gpus_per_node={pool.n_gpus_per_node} (each >= 1)")
    if cfg.trainer.backend != "ray":
        raise ConfigError(f"actor_rollout_ref.hybrid_engine=false runs the engines in Ray workers of their own: "
                          f"set trainer.backend=ray (got {cfg.trainer.backend!r})")
    if pool.n_gpus_per_node % tp:
        raise ConfigError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide "
                          f"rollout.n_gpus_per_node={pool.n_gpus_per_node}")


def check_frontend_process(cfg: PPOConfig) -> None:
    """``rollout.frontend_process`` serves vLLM's sync generate calls from a child process: the async
    loop drives the engine's front end directly, and tensor parallelism runs one engine per rank.

    Raises:
        ConfigError: naming the setting that does not fit.
    """
    rollout = cfg.actor_rollout_ref.rollout
    if not rollout.frontend_process:
        return
    key = "actor_rollout_ref.rollout.frontend_process"
    if rollout.name != "vllm":
        raise ConfigError(f"{key}=true is for the vllm engine; got actor_rollout_ref.rollout.name={rollout.name!r}")
    if rollout.mode != "sync":
        raise ConfigError(f"{key}=true serves the sync loop; set actor_rollout_ref.rollout.mode=sync "
                          f"(got {rollout.mode!r})")
    if rollout.tensor_model_parallel_size != 1:
        raise ConfigError(f"{key}=true needs actor_rollout_ref.rollout.tensor_model_parallel_size=1, "
                          f"got {rollout.tensor_model_parallel_size}")


def check_config(cfg: PPOConfig) -> None:
    """All start-up checks; raises ConfigError naming the offending key(s)."""
    check_choices(cfg)
    check_sampling(cfg)
    check_algorithm(cfg)
    check_batch_sizes(cfg)
    check_trainer_watch(cfg)
    check_staleness(cfg)
    check_split_pools(cfg)
    check_frontend_process(cfg)
