"""Build a ``RayPPOTrainer`` from a checked config: tokenizer, data, workers, rollout loop, rewards.

Each builder is one small function so the trainer module stays the step and nothing else.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import numpy as np
import torch
from verl import algorithms
from verl.trainer.ppo.config import PPOConfig
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


def build_dataset(files, tokenizer, cfg: PPOConfig, max_rows: int | None):
    """The prompts of ``files``: Search-R1 rows, or FlashRAG QA rows given the environment's prompt on load.

    Raises:
        ConfigError: a missing file, column or field, or a bad row (naming file, row and field).
    """
    from search_r1.qa_rows import FLASHRAG_FORM
    from verl.utils.dataset.rl_dataset import RLHFDataset

    files = [files] if isinstance(files, str) else list(files)
    for file in files:
        if not Path(file).expanduser().exists():
            raise ValueError(f"data file not found: {file} (prepare it with scripts/data_process/*.py)")
    try:
        dataset = RLHFDataset(files, tokenizer, prompt_key=cfg.data.prompt_key,
                              max_prompt_length=cfg.data.max_start_length,
                              filter_overlong_prompts=cfg.data.filter_overlong_prompts,
                              return_raw_chat=cfg.data.return_raw_chat, row_form=FLASHRAG_FORM)
    except (ValueError, FileNotFoundError) as error:  # the message names file, row and field
        raise ConfigError(str(error)) from None
    check_data_sources(dataset.rows, files)
    return _Head(dataset, max_rows)


def check_data_sources(rows: list[dict], files: list[str]) -> None:
    """Every row's ``data_source`` has a reward function (the default QA score's names).

    Raises:
        ConfigError: naming the files, the unknown values and the known ones.
    """
    from verl.utils.reward_score import QA_DATA_SOURCES

    unknown = sorted({str(row.get("data_source")) for row in rows} - QA_DATA_SOURCES)
    if unknown:
        raise ConfigError(f"{', '.join(map(str, files))}: data_source {', '.join(map(repr, unknown))} has no reward "
                          f"function; use one of {sorted(QA_DATA_SOURCES)} (docs/quickstart.md, custom data)")


def build_generation_manager(cfg: PPOConfig, tokenizer, engine, plan: RunPlan):
    from search_r1.llm_agent.generation import GenerationConfig, LLMGenerationManager
    from search_r1.search.client import RetrieverClient

    gen_config = GenerationConfig(
        max_turns=cfg.max_turns, max_start_length=cfg.data.max_start_length,
        max_prompt_length=cfg.data.max_prompt_length, max_response_length=plan.response_width,
        max_obs_length=cfg.data.max_obs_length, do_search=cfg.do_search, mode=cfg.actor_rollout_ref.rollout.mode)
    retriever = RetrieverClient(cfg.retriever.url, topk=cfg.retriever.topk, timeout=cfg.retriever.timeout,
                                max_retries=cfg.retriever.max_retries,
                                max_concurrency=cfg.retriever.max_concurrency) if cfg.do_search else None
    return LLMGenerationManager(tokenizer, engine, gen_config, retriever)


def build_validation_report(cfg: PPOConfig):
    """``(records, path) -> None`` writing the trajectory report of a validation dump
    (``<trainer.validation_data_dir>/<step>.html``), or None without a dump folder or with
    ``trainer.validation_report_questions`` 0."""
    limit = cfg.trainer.validation_report_questions
    if not cfg.trainer.validation_data_dir or limit <= 0:
        return None
    from search_r1.report import write_report

    def report(records: list[dict], path: Path) -> None:
        write_report(records, path, f"Validation of {cfg.trainer.experiment_name} at step {path.stem}",
                     f"step {path.stem}", max_questions=limit, details=(str(path.with_suffix(".jsonl")),))

    return report


def build_reward_fn(cfg: PPOConfig, tokenizer, num_examine: int):
    """EM reward (Search-R1's format-aware score with ``reward_model.style=format`` or non-zero
    format scores) over decoded responses."""
    from verl.utils.reward_score import default_compute_score
    from verl.workers.reward_manager import RewardManager

    rm = cfg.reward_model
    compute_score = functools.partial(default_compute_score, format_score=rm.format_score,
                                      structure_format_score=rm.structure_format_score,
                                      final_format_score=rm.final_format_score, retrieval_score=rm.retrieval_score,
                                      format_aware=rm.style == "format")
    return RewardManager(tokenizer, compute_score, num_examine)


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


def build_trainer(cfg: PPOConfig) -> RayPPOTrainer:
    """Everything the trainer needs, built in an order that fails cheaply first (data before models)."""
    from verl.trainer.ppo.worker_setup import build_worker_groups
    from verl.utils.dataset.rl_dataset import collate_fn

    seed_everything(cfg.trainer.seed)
    tokenizer = load_tokenizer(cfg)
    train_set = build_dataset(cfg.data.train_files, tokenizer, cfg, cfg.data.train_data_num)
    val_set = build_dataset(cfg.data.val_files, tokenizer, cfg, cfg.data.val_data_num)
    try:
        sampler = ResumableBatchSampler(len(train_set), cfg.data.train_batch_size,
                                        shuffle=cfg.data.shuffle_train_dataloader, seed=cfg.data.seed)
    except ValueError as error:  # fewer rows than one batch: the user's data or batch size
        raise ConfigError(f"{error}; data.train_files={cfg.data.train_files}") from None
    plan = make_run_plan(cfg, sampler.batches_per_epoch)
    train_data = train_data_record(cfg.data.train_files)
    check_resume(cfg, train_data, plan.total_training_steps)
    print(plan.describe(), flush=True)
    tracker = Tracking(cfg.trainer.project_name, cfg.trainer.experiment_name, list(cfg.trainer.logger),
                       cfg.trainer.log_dir, config=to_plain(cfg))
    workers = build_worker_groups(cfg, plan)
    try:
        engine = WorkerGroupEngine(workers.actor_rollout, world_size=plan.data_parallel_size)
        val_batch_size = cfg.data.val_batch_size
        return RayPPOTrainer(
            cfg, plan, tokenizer, workers, BatchLoader(train_set, collate_fn, sampler),
            val_batches=lambda: iterate_in_order(val_set, collate_fn, val_batch_size),
            generation_manager=build_generation_manager(cfg, tokenizer, engine, plan),
            reward_fn=build_reward_fn(cfg, tokenizer, cfg.reward_model.num_examine),
            val_reward_fn=build_reward_fn(cfg, tokenizer, 1),
            kl_ctrl=algorithms.get_kl_controller(cfg.algorithm.kl_ctrl), tracker=tracker,
            num_params=count_parameters(cfg.actor_rollout_ref.model.path), val_report=build_validation_report(cfg),
            train_data=train_data)
    except BaseException:  # e.g. a Ctrl-C here: the trainer that would stop the workers does not exist yet
        workers.shutdown()
        tracker.finish()
        raise
