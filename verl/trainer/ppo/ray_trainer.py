"""The PPO/GRPO trainer loop on the single controller: the seven lines of the step in docs/architecture.md.

Everything else lives in sibling modules: ``stages`` (grouping, rewards, advantages),
``rollout_adapter`` (the worker group as an engine), ``training_rollouts`` (each step's rollout, in
step or one update ahead), ``metric_utils``, ``health`` (the per-step
collapse signals and alarms), ``validation``, ``checkpointing``, ``data_loading``; building the
pieces is ``trainer_setup``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from tqdm import tqdm

from verl.single_controller.base.worker_group import PendingCall
from verl.trainer.ppo import checkpointing, metric_utils, resume_check, stages
from verl.trainer.ppo.health import HealthMonitor
from verl.trainer.ppo.time_budget import TimeBudget
from verl.trainer.ppo.training_rollouts import TrainingRollouts
from verl.trainer.ppo.validation import run_validation
from verl.trainer.run_exit import HealthAlarmStop
from verl.utils.config import ConfigError
from verl.utils.timer import timer


@dataclass
class WorkerHandles:
    """The worker groups of the run (their data-parallel methods split and pad rows themselves).

    ``actor_rollout``: actor + rollout engine (+ reference when colocated); ``ref``: the group that
    computes ``ref_log_probs`` (None when no KL is used); ``critic``: None for GRPO; ``shutdown``
    stops the workers (and Ray). Split pools (``actor_rollout_ref.hybrid_engine=false``): ``rollout``
    is the engines' group (``actor_rollout`` then has no engine) and ``sync_weights(after_update)`` pushes
    the actor's weights to it (returns its metrics; ``after_update=False``: a push that is not a new
    update, e.g. after a resume); colocated, the update pushes them itself.
    """

    actor_rollout: Any
    ref: Any
    critic: Any
    shutdown: Callable = lambda: None
    rollout: Any = None
    sync_weights: Callable[..., dict] = lambda after_update=True: {}

    @property
    def rollout_group(self):
        """The group whose engines run the rollouts."""
        return self.rollout if self.rollout is not None else self.actor_rollout


class RayPPOTrainer:
    """PPO (``gae`` + critic) and GRPO (``grpo``, no critic) over an environment's multi-turn rollouts."""

    def __init__(self, config, plan, tokenizer, workers: WorkerHandles, train_loader, val_batches: Callable,
                 rollout, reward_fn, val_reward_fn, kl_ctrl, tracker, num_params: int = 0,
                 val_report: Callable | None = None, train_data: list[dict] | None = None):
        """``config``: the run's config; ``plan``: its ``RunPlan`` (derived values); ``rollout``: the
        ``MultiTurnRollout`` (its ``env`` is the run's environment); ``val_report``:
        writes the report beside each validation dump (``validation.run_validation``'s ``report``);
        ``train_data``: what the run trains on (:func:`~verl.trainer.ppo.resume_check.train_data_record`),
        kept in each checkpoint."""
        self.config, self.plan, self.tokenizer, self.workers = config, plan, tokenizer, workers
        self.val_batches = val_batches
        self.train_rollouts = TrainingRollouts(train_loader, self.start_rollout,
                                               config.actor_rollout_ref.rollout.staleness) if train_loader else None
        self.rollout, self.reward_fn, self.val_reward_fn = rollout, reward_fn, val_reward_fn
        self.kl_ctrl, self.tracker, self.num_params, self.val_report = kl_ctrl, tracker, num_params, val_report
        self.train_data = train_data
        self.total_steps = plan.total_training_steps
        from verl.trainer.ppo.rollout_adapter import sampling_params

        rollout_cfg, data_cfg = config.actor_rollout_ref.rollout, config.data
        self.train_params = sampling_params(rollout_cfg, data_cfg.max_response_length)
        self.val_params = sampling_params(rollout_cfg, data_cfg.max_response_length, validate=True)
        self.peak_flops = metric_utils.device_peak_flops(config.trainer.device_peak_flops)
        self.health = HealthMonitor(config.trainer.health, rollout.env, tokenizer)
        self.time_budget = TimeBudget(config.trainer.max_time_s)
        self.global_step = 0
        self.updates_done = 0  # actor updates this run made (since its start or resume)
        self.unfinished_save: int | None = None  # the step of a save that an exception cut short

    # ----------------------------------------------------------------------------------- the step
    def step(self) -> dict[str, float]:
        """One PPO/GRPO iteration on the next batch of prompts; returns its metrics."""
        cfg, w, timings, metrics = self.config, self.workers, {}, {}
        with timer("step", timings):
            with timer("gen", timings):  # staleness 1: the wait for a rollout started a step ago
                batch = self.train_rollouts.next(more=self.global_step < self.total_steps)     # 1, 2
            if "updates_pushed" in batch.meta_info:  # updates between the sampling weights and these
                metrics["rollout/policy_lag"] = float(self.updates_done - batch.meta_info["updates_pushed"])
            gen_split = batch.meta_info.get("timing", {})  # seconds inside the rollout, by what waited
            timings["tool"] = gen_split.get("tool_s", 0.0)
            timings["gen_engine"] = gen_split.get("generation_s", 0.0)
            timings["gen_loop"] = gen_split.get("total_s", 0.0)  # gen less this: sending rows and trajectories
            for key in ("engine_calls", "decode_steps"):
                if key in gen_split:
                    metrics[f"perf/rollout_{key}"] = float(gen_split[key])
            with timer("reward", timings):
                metrics.update(_prefix("reward_extra", stages.score(batch, self.reward_fn)))   # 3
            self.compute_log_probs_and_values(batch, timings, metrics)                         # 4
            with timer("adv", timings):
                metrics.update(stages.apply_rewards(batch, cfg.algorithm, self.kl_ctrl))       # 5
                stages.compute_advantage(batch, cfg.algorithm)
            if w.critic is not None:
                with timer("update_critic", timings):                                          # 6
                    metrics.update(self.update(w.critic, "update_critic", batch))
            if self.global_step > cfg.trainer.critic_warmup:
                with timer("update_actor", timings):  # with the weight push, as colocated
                    metrics.update(self.update(w.actor_rollout, "update_actor", batch))
                    if w.rollout is not None:
                        metrics.update(self.push_weights())
                self.updates_done += 1
        metrics.update(self.step_metrics(batch, timings))                                      # 7
        metrics.update(self.health.observe(self.global_step, batch, metrics))
        return metrics

    # ------------------------------------------------------------------------------ step helpers
    def generate(self, batch, params, on_turn=None):
        """The environment's multi-turn rollout, driven from the controller; keeps the prompt rows'
        fields. ``on_turn``: the rollout's per-turn progress callback (sync mode)."""
        return stages.carry_row_fields(batch, self.rollout.run(batch, params, on_turn=on_turn))

    def start_rollout(self, batch):
        """Start the multi-turn rollout of a training batch's prompts (``n`` samples each) on the
        workers; returns the pending call whose ``get()`` gives the rolled-out batch."""
        batch = stages.expand_groups(batch, self.plan.rollout_n)
        return PendingCall(self.rollout.start(batch, self.train_params).get,
                           lambda output: stages.carry_row_fields(batch, output))

    def compute_log_probs_and_values(self, batch, timings: dict, metrics: dict) -> None:
        w = self.workers
        with timer("old_log_prob", timings):
            if not self.plan.on_policy_update:  # else the update uses its own log-probs (on-policy)
                stages.merge_outputs(batch, w.actor_rollout.compute_log_prob(batch))
        if "entropys" in batch.batch.keys():
            mask = batch.batch["response_mask"].bool()
            metrics["actor/entropy"] = batch.batch["entropys"][mask].mean().item() if mask.any() else 0.0
        if w.ref is not None:
            with timer("ref", timings):
                stages.merge_outputs(batch, w.ref.compute_ref_log_prob(batch))
        if w.critic is not None:
            with timer("values", timings):
                stages.merge_outputs(batch, w.critic.compute_values(batch))

    def push_weights(self) -> dict[str, float]:
        """Split pools: the new weights to the engines, once the rollout in flight (staleness 1) ended;
        its wait is ``timing_s/rollout_wait``, as when the colocated update waits for it."""
        started = time.perf_counter()
        self.train_rollouts.settle()
        waited = time.perf_counter() - started
        return {**self.workers.sync_weights(), "timing_s/rollout_wait": waited}

    def update(self, group, method: str, batch) -> dict[str, float]:
        output = getattr(group, method)(batch)
        return metric_utils.reduce_worker_metrics(output.meta_info.get("metrics", {}))

    def step_metrics(self, batch, timings: dict) -> dict[str, float]:
        metrics = metric_utils.compute_data_metrics(batch, self.workers.critic is not None, self.rollout.env)
        metrics.update(metric_utils.compute_timing_metrics(timings))
        metrics.update(metric_utils.compute_throughput_metrics(
            stages.num_tokens(batch), timings, self.num_params,
            self.config.actor_rollout_ref.actor.ppo_epochs, self.plan.data_parallel_size, self.peak_flops))
        return metrics

    # ------------------------------------------------------------------------------------- loop
    def fit(self) -> dict[str, float]:
        """Resume, validate, train ``total_steps`` steps with periodic validation and checkpoints."""
        trainer_cfg = self.config.trainer
        self.resume()
        metrics: dict[str, float] = {}
        if trainer_cfg.val_only or (trainer_cfg.val_before_train and self.global_step == 0):
            metrics = self.validate()
            self.best_value(metrics)  # a keep_best metric validation does not report fails here, at once
            self.tracker.log(metrics, step=self.global_step)
        if trainer_cfg.val_only:
            return metrics
        with tqdm(total=self.total_steps, initial=self.global_step, desc="training", dynamic_ncols=True) as bar:
            while self.global_step < self.total_steps:
                self.global_step += 1
                metrics = self.step()
                try:
                    self.health.check_stop(self.global_step)
                except HealthAlarmStop:
                    self.tracker.log(metrics, step=self.global_step)  # the alarm's step, not validated or saved
                    raise
                self.time_budget.record("step", metrics["timing_s/step"])
                last = self.global_step == self.total_steps or self.out_of_time()
                metrics.update(self.periodic(last))
                self.tracker.log(metrics, step=self.global_step)
                bar.set_postfix(score=f"{metrics.get('critic/score/mean', float('nan')):.3f}")
                bar.update(1)
                if last:
                    break
        return metrics

    def out_of_time(self) -> bool:
        """Whether ``trainer.max_time_s`` makes this step the last (said in the log when it does)."""
        trainer_cfg, step = self.config.trainer, self.global_step
        if not self.time_budget.last_step(_due(trainer_cfg.test_freq, step), _due(trainer_cfg.save_freq, step),
                                          trainer_cfg.test_freq > 0, trainer_cfg.save_freq > 0):
            return False
        print(f"trainer.max_time_s: step {step} of {self.total_steps} is the last, with the end's validation and "
              f"checkpoint ({self.time_budget.explain()})", flush=True)
        return True

    def periodic(self, last: bool) -> dict[str, float]:
        """Validation every ``test_freq`` and a checkpoint every ``save_freq`` steps (and at the end),
        and one at a validation that beats the best so far (``trainer.keep_best``)."""
        trainer_cfg, step, metrics = self.config.trainer, self.global_step, {}
        if _due(trainer_cfg.test_freq, step, last):
            metrics.update(self.validate())
        best = self.best_value(metrics)
        if _due(trainer_cfg.save_freq, step, last) or best is not None:
            self.save(best)
        return metrics

    def best_value(self, metrics: dict[str, float]) -> float | None:
        """The ``trainer.keep_best`` metric of this step's validation when it beats every earlier
        one (from step 1 on), else None.

        Raises:
            ConfigError: validation ran and reports no such metric (naming those it reports).
        """
        metric = self.config.trainer.keep_best
        validated = sorted(key for key in metrics if key.startswith("val/"))
        if metric is None or not validated:
            return None
        if metric not in metrics:
            raise ConfigError(f"trainer.keep_best={metric}: validation reports no such metric; it reports "
                             f"{', '.join(validated)}")
        best = checkpointing.read_best(self.config.trainer.default_local_dir)
        improved = best is None or metrics[metric] > best["value"]
        return float(metrics[metric]) if improved and self.global_step > 0 else None

    def validate(self) -> dict[str, float]:
        def generate(batch, on_turn=None):
            batch = stages.expand_groups(batch, self.config.actor_rollout_ref.rollout.val_kwargs.n)
            return self.generate(batch, self.val_params, on_turn)

        started = time.time()
        metrics = run_validation(self.val_batches(), generate, self.val_reward_fn, self.tokenizer, self.rollout.env,
                                 dump_dir=self.config.trainer.validation_data_dir, global_step=self.global_step,
                                 report=self.val_report)
        self.time_budget.record("validation", time.time() - started)
        return metrics

    # ------------------------------------------------------------------------------- checkpoints
    def save(self, best: float | None = None) -> None:
        """A checkpoint of this step; ``best``: the step's ``keep_best`` value, a new best (recorded
        once the checkpoint is complete). The best checkpoint is never pruned."""
        w, trainer_cfg = self.workers, self.config.trainer

        def save_workers(folder):
            w.actor_rollout.save_checkpoint(str(folder / "actor"))
            if w.critic is not None:
                w.critic.save_checkpoint(str(folder / "critic"))
            if trainer_cfg.export_hf:
                w.actor_rollout.export_hf(str(folder / "huggingface"))

        state = {"data": self.train_rollouts.state_dict(), "kl_coef": float(self.kl_ctrl.value),
                 resume_check.RECORD_KEY: self.train_data, "health": self.health.state_dict()}
        root = trainer_cfg.default_local_dir
        previous = checkpointing.read_best(root)
        keep = [self.global_step] if best is not None else [previous["step"]] if previous else []
        started = time.time()
        try:
            checkpointing.save_checkpoint(root, self.global_step, state, save_workers,
                                          max_to_keep=trainer_cfg.max_actor_ckpt_to_keep, keep=keep)
        except BaseException:  # e.g. a Ctrl-C: the workers may still be writing; shutdown() discards it
            self.unfinished_save = self.global_step
            raise
        self.time_budget.record("save", time.time() - started)
        if best is not None:
            checkpointing.write_best(root, self.global_step, trainer_cfg.keep_best, best)

    def resume(self) -> None:
        """Load the checkpoint chosen by ``trainer.resume_mode`` (workers, data position, KL, RNG)."""
        trainer_cfg = self.config.trainer
        path = checkpointing.resolve_resume_path(trainer_cfg.resume_mode, trainer_cfg.default_local_dir)
        if path is None:
            return
        self.workers.actor_rollout.load_checkpoint(str(path / "actor"))
        self.workers.sync_weights(after_update=False)  # split pools: the engines serve the resumed weights
        if self.workers.critic is not None:
            self.workers.critic.load_checkpoint(str(path / "critic"))
        state = checkpointing.load_trainer_state(path)
        self.global_step = int(state["global_step"])
        self.train_rollouts.load_state_dict(state["data"])
        self.kl_ctrl.value = state["kl_coef"]
        self.health.load_state_dict(state.get("health", {}))
        print(f"resumed from {path} at global step {self.global_step}", flush=True)

    def shutdown(self) -> None:
        """Close the loggers and stop the workers (and Ray); then drop what a save cut short left."""
        self.tracker.finish()
        self.workers.shutdown()
        if self.unfinished_save is not None:
            checkpointing.discard_partial(self.config.trainer.default_local_dir, self.unfinished_save)


def _due(freq: int, step: int, last: bool = False) -> bool:
    """Whether a ``*_freq`` setting (<= 0: off) falls on ``step``; an enabled one always falls on the last."""
    return freq > 0 and (step % freq == 0 or last)


def _prefix(prefix: str, info: dict) -> dict[str, float]:
    """Means of the reward manager's per-row extra info, e.g. ``reward_extra/em``."""
    out = {}
    for key, values in info.items():
        try:
            out[f"{prefix}/{key}"] = float(torch.as_tensor(values, dtype=torch.float32).mean())
        except (TypeError, ValueError):
            continue
    return out
