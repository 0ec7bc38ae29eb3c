"""Build a ``RayPPOTrainer`` from a checked config: tokenizer, environment, data, workers, rollout loop, rewards.

Each builder is one small function so the trainer module stays the step and nothing else.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from verl import algorithms
from verl.envs.base import Environment
from verl.trainer.ppo.config import PPOConfig, environment_of
from verl.trainer.ppo.data_loading import BatchLoader, ResumableBatchSampler, iterate_in_order
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.resume_check import check_resume, train_data_record
from verl.trainer.ppo.rollout_adapter import WorkerGroupEngine
from verl.trainer.ppo.run_plan import RunPlan, make_run_plan
from verl.utils.config import ConfigError, to_plain
from verl.utils.tracking import Tracking


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's RNGs of the controller."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_tokenizer(cfg: PPOConfig):
    from transformers import AutoTokenizer

    path = cfg.data.tokenizer or cfg.actor_rollout_ref.model.path
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class _Head:
    """The first ``n`` rows of a dataset (``data.train_data_num`` / ``data.val_data_num``)."""

    def __init__(self, dataset, n: int | None):
        self.dataset = dataset
        self.n = len(dataset) if n is None else min(int(n), len(dataset))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if not 0 <= index < self.n:
            raise IndexError(index)
        return self.dataset[index]


def build_environment(cfg: PPOConfig, tokenizer) -> Environment:
    """The run's environment (``env.name``), bound to the policy's tokenizer."""
    return environment_of(cfg).from_config(cfg, tokenizer)


def build_dataset(files, tokenizer, cfg: PPOConfig, max_rows: int | None, env: Environment):
    """The prompts of ``files`` in the environment's form (its rows, or FlashRAG QA rows given its prompt on load).

    Raises:
        ConfigError: a missing file, column or field, a bad row (naming file, row and field), or a
            ``data_source`` the environment has no reward for.
    """
    from verl.utils.dataset.rl_dataset import RLHFDataset

    files = [files] if isinstance(files, str) else list(files)
    for file in files:
        if not Path(file).expanduser().exists():
            raise ValueError(f"data file not found: {file} (prepare it with scripts/data_process/*.py)")
    try:
        dataset = RLHFDataset(files, tokenizer, cfg.data, env)
    except (ValueError, FileNotFoundError) as error:  # the message names file, row and field
        raise ConfigError(str(error)) from None
    unknown = sorted({str(row.get("data_source")) for row in dataset.rows} - env.data_sources) \
        if env.data_sources is not None else []
    if unknown:
        raise ConfigError(f"{', '.join(map(str, files))}: data_source {', '.join(map(repr, unknown))} has no reward "
                          f"function in environment {env.name!r}; use one of {sorted(env.data_sources)} "
                          f"(docs/quickstart.md, custom data)")
    return _Head(dataset, max_rows)


def loop_config(cfg: PPOConfig, plan: RunPlan):
    """The agent loop's budgets from the run's keys."""
    from verl.workers.rollout.agent_loop import LoopConfig

    return LoopConfig(max_turns=cfg.max_turns, max_start_length=cfg.data.max_start_length,
                      max_prompt_length=cfg.data.max_prompt_length, max_response_length=plan.response_width,
                      mode=cfg.actor_rollout_ref.rollout.mode, log_probs=plan.rollout_log_probs)


def build_rollout(cfg: PPOConfig, tokenizer, engine, plan: RunPlan, env: Environment):
    """The multi-turn rollout of the run's environment over ``engine``."""
    from verl.workers.rollout.agent_loop import MultiTurnRollout

    return MultiTurnRollout(tokenizer, engine, env, loop_config(cfg, plan))


def build_validation_report(cfg: PPOConfig):
    """``(records, path) -> None`` writing the environment's trajectory report of a validation dump
    (``<trainer.validation_data_dir>/<step>.html``), or None without a dump folder, with
    ``trainer.validation_report_questions`` 0, or when the environment has no report."""
    limit = cfg.trainer.validation_report_questions
    write_report = environment_of(cfg).report_writer()
    if not cfg.trainer.validation_data_dir or limit <= 0 or write_report is None:
        return None

    def report(records: list[dict], path: Path) -> None:
        write_report(records, path, f"Validation of {cfg.trainer.experiment_name} at step {path.stem}",
                     f"step {path.stem}", max_questions=limit, details=(str(path.with_suffix(".jsonl")),))

    return report


def build_reward_fn(env: Environment, tokenizer, num_examine: int):
    """The environment's reward (``Environment.compute_score``) over decoded responses."""
    from verl.workers.reward_manager import RewardManager

    return RewardManager(tokenizer, env.compute_score, num_examine)


def count_parameters(model_path: str) -> int:
    """Parameter count from the HF config (model built on the meta device: no memory, no weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model_path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return sum(p.numel() for p in model.parameters())
    except (OSError, ValueError):
        return 0


@dataclass(frozen=True)
class PreparedRun:
    """What a run has before any worker starts: tokenizer, environment, data, the checked plan."""

    tokenizer: object
    env: Environment
    train_set: object
    val_set: object
    sampler: ResumableBatchSampler
    plan: RunPlan
    train_data: dict


def prepare_run(cfg: PPOConfig) -> PreparedRun:
    """Tokenizer, environment, data and the run plan (printed), checked against a checkpoint to resume.

    Raises:
        ConfigError: bad data, a batch larger than the data, or a checkpoint this run cannot resume.
    """
    seed_everything(cfg.trainer.seed)
    tokenizer = load_tokenizer(cfg)
    env = build_environment(cfg, tokenizer)
    train_set = build_dataset(cfg.data.train_files, tokenizer, cfg, cfg.data.train_data_num, env)
    val_set = build_dataset(cfg.data.val_files, tokenizer, cfg, cfg.data.val_data_num, env)
    try:
        sampler = ResumableBatchSampler(len(train_set), cfg.data.train_batch_size,
                                        shuffle=cfg.data.shuffle_train_dataloader, seed=cfg.data.seed)
    except ValueError as error:  # fewer rows than one batch: the user's data or batch size
        raise ConfigError(f"{error}; data.train_files={cfg.data.train_files}") from None
    plan = make_run_plan(cfg, sampler.batches_per_epoch)
    train_data = train_data_record(cfg.data.train_files)
    check_resume(cfg, train_data, plan.total_training_steps)
    print(plan.describe(), flush=True)
    return PreparedRun(tokenizer, env, train_set, val_set, sampler, plan, train_data)


def dry_run(cfg: PPOConfig) -> None:
    """``trainer.dry_run``: the start-up of a run up to its workers, then the placement
    (:func:`verl.trainer.ppo.placement.dry_run`); no worker starts, no model loads."""
    from verl.trainer.ppo.placement import dry_run as dry_run_placement
    from verl.trainer.ppo.worker_setup import use_gpu

    run = prepare_run(cfg)
    if cfg.trainer.backend == "ray":
        dry_run_placement(cfg, run.plan, use_gpu())
    else:
        print("placement: trainer.backend=local runs one rank inside this process", flush=True)


def build_trainer(cfg: PPOConfig) -> RayPPOTrainer:
    """Everything the trainer needs, built in an order that fails cheaply first (data before models)."""
    from verl.trainer.ppo.worker_setup import build_worker_groups
    from verl.utils.dataset.rl_dataset import collate_fn

    run = prepare_run(cfg)
    tokenizer, env, train_set, val_set, sampler, plan, train_data = (
        run.tokenizer, run.env, run.train_set, run.val_set, run.sampler, run.plan, run.train_data)
    tracker = Tracking(cfg.trainer.project_name, cfg.trainer.experiment_name, list(cfg.trainer.logger),
                       cfg.trainer.log_dir, config=to_plain(cfg))
    workers = build_worker_groups(cfg, plan)
    try:
        engine = WorkerGroupEngine(workers.rollout_group, world_size=workers.rollout_group.world_size)
        val_batch_size = cfg.data.val_batch_size
        return RayPPOTrainer(
            cfg, plan, tokenizer, workers, BatchLoader(train_set, collate_fn, sampler),
            val_batches=lambda: iterate_in_order(val_set, collate_fn, val_batch_size),
            rollout=build_rollout(cfg, tokenizer, engine, plan, env),
            reward_fn=build_reward_fn(env, tokenizer, cfg.reward_model.num_examine),
            val_reward_fn=build_reward_fn(env, tokenizer, 1),
            kl_ctrl=algorithms.get_kl_controller(cfg.algorithm.kl_ctrl), tracker=tracker,
            num_params=count_parameters(cfg.actor_rollout_ref.model.path), val_report=build_validation_report(cfg),
            train_data=train_data)
    except BaseException:  # e.g. a Ctrl-C here: the trainer that would stop the workers does not exist yet
        workers.shutdown()
        tracker.finish()
        raise
