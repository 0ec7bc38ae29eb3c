"""Build a ``RayPPOTrainer`` from a checked config: tokenizer, data, workers, rollout loop, rewards.

Each builder is one small function so the trainer module stays the step and nothing else.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from verl.trainer.ppo import core_algos
from verl.trainer.ppo.config_check import data_parallel_size
from verl.trainer.ppo.data_loading import BatchLoader, ResumableBatchSampler, iterate_in_order
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.rollout_adapter import WorkerGroupEngine
from verl.utils.tracking import Tracking


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_tokenizer(cfg: DictConfig):
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


def build_dataset(files, tokenizer, cfg: DictConfig, max_rows: int | None):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    files = [files] if isinstance(files, str) else list(files)
    for file in files:
        if not Path(file).expanduser().exists():
            raise ValueError(f"data file not found: {file} (prepare it with scripts/data_process/*.py)")
    dataset = RLHFDataset(files, tokenizer, prompt_key=cfg.data.prompt_key,
                          max_prompt_length=cfg.data.max_start_length)
    return _Head(dataset, max_rows)


def total_training_steps(cfg: DictConfig, batches_per_epoch: int) -> int:
    """``trainer.total_training_steps`` if set, else ``total_epochs x batches_per_epoch``."""
    if cfg.trainer.total_training_steps is not None:
        return int(cfg.trainer.total_training_steps)
    return int(cfg.trainer.total_epochs) * batches_per_epoch


def response_width(cfg: DictConfig) -> int:
    """Width R of the trajectory tensors: every turn's tokens plus every observation.

    ``data.max_response_length`` is per turn (Search-R1's meaning); a trajectory has up to
    ``max_turns + 1`` generations and ``max_turns`` observations.
    """
    turns = int(cfg.max_turns)
    return int(cfg.data.max_response_length) * (turns + 1) + int(cfg.data.max_obs_length) * turns


def generation_config(cfg: DictConfig):
    """The search loop's budgets and mode (raises ValueError on an unknown ``rollout.mode``)."""
    from search_r1.llm_agent.generation import GenerationConfig

    return GenerationConfig(
        max_turns=int(cfg.max_turns), max_start_length=int(cfg.data.max_start_length),
        max_prompt_length=int(cfg.data.max_prompt_length), max_response_length=response_width(cfg),
        max_obs_length=int(cfg.data.max_obs_length), do_search=bool(cfg.do_search),
        mode=str(cfg.actor_rollout_ref.rollout.mode))


def build_generation_manager(cfg: DictConfig, tokenizer, engine, gen_config):
    from search_r1.llm_agent.generation import LLMGenerationManager
    from search_r1.search.client import RetrieverClient

    retriever = RetrieverClient(cfg.retriever.url, topk=int(cfg.retriever.topk), timeout=float(cfg.retriever.timeout),
                                max_retries=int(cfg.retriever.max_retries),
                                max_concurrency=int(cfg.retriever.max_concurrency)) if cfg.do_search else None
    return LLMGenerationManager(tokenizer, engine, gen_config, retriever)


def build_reward_fn(cfg: DictConfig, tokenizer, num_examine: int):
    """EM reward (plus the format scores when non-zero) over decoded responses."""
    from verl.utils.reward_score import default_compute_score
    from verl.workers.reward_manager import RewardManager

    rm = cfg.reward_model
    compute_score = functools.partial(default_compute_score, format_score=rm.format_score,
                                      structure_format_score=rm.structure_format_score,
                                      final_format_score=rm.final_format_score, retrieval_score=rm.retrieval_score)
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


def _inject_total_steps(cfg: DictConfig, total_steps: int) -> None:
    # The LR schedulers (warmup ratio, cosine) need the run length before the workers start.
    with open_dict(cfg):
        cfg.actor_rollout_ref.actor.optim.total_training_steps = total_steps
        cfg.critic.optim.total_training_steps = total_steps


def build_trainer(cfg: DictConfig) -> RayPPOTrainer:
    """Everything the trainer needs, built in an order that fails cheaply first (data before models)."""
    from verl.trainer.ppo.worker_setup import build_worker_groups

    seed_everything(int(cfg.trainer.seed))
    tokenizer = load_tokenizer(cfg)
    train_set = build_dataset(cfg.data.train_files, tokenizer, cfg, cfg.data.train_data_num)
    val_set = build_dataset(cfg.data.val_files, tokenizer, cfg, cfg.data.val_data_num)
    from verl.utils.dataset.rl_dataset import collate_fn

    sampler = ResumableBatchSampler(len(train_set), int(cfg.data.train_batch_size),
                                    shuffle=bool(cfg.data.shuffle_train_dataloader), seed=int(cfg.data.seed))
    total_steps = total_training_steps(cfg, sampler.batches_per_epoch)
    _inject_total_steps(cfg, total_steps)
    gen_config = generation_config(cfg)  # before any model loads: a bad rollout.mode fails here
    tracker = Tracking(cfg.trainer.project_name, cfg.trainer.experiment_name, list(cfg.trainer.logger),
                       cfg.trainer.log_dir, config=OmegaConf.to_container(cfg, resolve=True))
    workers = build_worker_groups(cfg)
    engine = WorkerGroupEngine(workers.actor_rollout, world_size=data_parallel_size(cfg))
    val_batch_size = int(cfg.data.val_batch_size)
    return RayPPOTrainer(
        cfg, tokenizer, workers, BatchLoader(train_set, collate_fn, sampler),
        val_batches=lambda: iterate_in_order(val_set, collate_fn, val_batch_size),
        generation_manager=build_generation_manager(cfg, tokenizer, engine, gen_config),
        reward_fn=build_reward_fn(cfg, tokenizer, int(cfg.reward_model.num_examine)),
        val_reward_fn=build_reward_fn(cfg, tokenizer, 1),
        kl_ctrl=core_algos.get_kl_controller(cfg.algorithm.kl_ctrl), tracker=tracker, total_steps=total_steps,
        num_params=count_parameters(cfg.actor_rollout_ref.model.path))
