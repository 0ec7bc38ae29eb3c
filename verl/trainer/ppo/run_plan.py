"""Values derived from a ``PPOConfig`` and the data, computed once at start and printed.

Nothing changes the configuration after :func:`verl.trainer.ppo.config.load_config`: what the run
needs beyond it (samples per prompt, the run length, per-rank batch sizes, the engine length, the
trajectory width, which workers exist) is computed here by pure functions into a frozen
:class:`RunPlan`, which the trainer and the worker set-up read.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.trainer.ppo import config_check
from verl.trainer.ppo.config import PPOConfig
from verl.workers import batching
from verl.workers.fsdp_workers import WorkerRun
from verl.workers.rollout.config import engine_max_model_len


@dataclass(frozen=True)
class RunPlan:
    """The run's derived values.

    Args:
        rollout_n: responses per prompt (``rollout.n``, or Search-R1's ``n_agent``).
        data_parallel_size: ranks (``nnodes x n_gpus_per_node``).
        needs_critic: the advantage estimator reads values (a critic is trained).
        needs_reference: a KL term needs the reference policy.
        on_policy_update: the update may reuse its own log-probs as ``old_log_probs``.
        rollout_log_probs: the rollout returns the engine's log-probs (``rollout_log_probs``).
        batches_per_epoch: training batches of ``data.train_batch_size`` prompts per epoch.
        total_training_steps: steps of the run (``trainer.total_training_steps`` or epochs x batches).
        engine_max_model_len: the rollout engine's context length.
        response_width: width R of the trajectory tensors (every turn's tokens and observations).
        actor_update: the actor's per-rank update batching.
        critic_update: the critic's per-rank update batching (None without a critic).
    """

    rollout_n: int
    data_parallel_size: int
    needs_critic: bool
    needs_reference: bool
    on_policy_update: bool
    rollout_log_probs: bool
    batches_per_epoch: int
    total_training_steps: int
    engine_max_model_len: int
    response_width: int
    actor_update: batching.UpdateBatching
    critic_update: batching.UpdateBatching | None

    def worker_run(self, cfg: PPOConfig) -> WorkerRun:
        """What the workers receive (:class:`~verl.workers.fsdp_workers.WorkerRun`)."""
        return WorkerRun(rollout_n=self.rollout_n, total_training_steps=self.total_training_steps,
                         max_model_len=self.engine_max_model_len, host_memory=cfg.trainer.host_memory)

    def describe(self) -> str:
        """The plan as a few lines for the start of the log."""
        critic = (f"critic update {self.critic_update.mini_batch_rows} rows/rank in micro-batches of "
                  f"{self.critic_update.micro.rows or 'dynamic'}" if self.critic_update else "no critic")
        return "\n".join([
            f"run plan: {self.total_training_steps} steps ({self.batches_per_epoch} batches/epoch), "
            f"{self.rollout_n} responses/prompt, {self.data_parallel_size} rank(s)",
            f"  actor update {self.actor_update.mini_batch_rows} rows/rank in micro-batches of "
            f"{self.actor_update.micro.rows or 'dynamic'}; {critic}; "
            f"reference: {'yes' if self.needs_reference else 'no'}; "
            f"old_log_probs pass: {'skipped (on-policy)' if self.on_policy_update else 'yes'}; "
            f"rollout log-probs: {'yes' if self.rollout_log_probs else 'no'}",
            f"  engine max_model_len {self.engine_max_model_len}, trajectory width {self.response_width} tokens"])


def response_width(cfg: PPOConfig) -> int:
    """Width R of the trajectory tensors: every turn's tokens plus every observation.

    ``data.max_response_length`` is per turn (Search-R1's meaning); a trajectory has up to
    ``max_turns + 1`` generations and ``max_turns`` observations.
    """
    turns = cfg.max_turns
    return cfg.data.max_response_length * (turns + 1) + cfg.data.max_obs_length * turns


def total_training_steps(cfg: PPOConfig, batches_per_epoch: int) -> int:
    """``trainer.total_training_steps`` if set, else ``total_epochs x batches_per_epoch``."""
    if cfg.trainer.total_training_steps is not None:
        return cfg.trainer.total_training_steps
    return cfg.trainer.total_epochs * batches_per_epoch


def make_run_plan(cfg: PPOConfig, batches_per_epoch: int) -> RunPlan:
    """The plan of a checked configuration over a training set of ``batches_per_epoch`` batches."""
    n, dp = config_check.rollout_n(cfg), config_check.data_parallel_size(cfg)
    critic = config_check.needs_critic(cfg)
    return RunPlan(
        rollout_n=n, data_parallel_size=dp, needs_critic=critic,
        needs_reference=config_check.needs_reference(cfg), on_policy_update=config_check.on_policy_update(cfg),
        rollout_log_probs=config_check.rollout_log_probs(cfg),
        batches_per_epoch=batches_per_epoch, total_training_steps=total_training_steps(cfg, batches_per_epoch),
        engine_max_model_len=engine_max_model_len(cfg.actor_rollout_ref.rollout, cfg.data),
        response_width=response_width(cfg),
        actor_update=batching.actor_update_batching(cfg.actor_rollout_ref.actor, n, dp),
        critic_update=batching.critic_batching(cfg.critic, n, dp)[0] if critic else None)
