"""Supervised fine-tuning (full or LoRA) on FSDP2: ``python -m verl.trainer.fsdp_sft_trainer k=v ...``.

Decisions:

* One model path: ``fsdp_utils.load_causal_lm`` + ``apply_fsdp2``, the same code the RL actor uses,
  so an SFT run exercises the same sharding, gradient checkpointing and export.
* The loss is the token-mean negative log-likelihood over the whole global batch of the tokens whose
  ``loss_mask`` is 1 (assistant text, not prompts and not ``<information>`` observations; see
  ``verl.utils.dataset.sft_dataset``). Each micro-batch contributes ``sum(nll) / tokens_in_batch``,
  so the gradient does not depend on how the batch is split into micro-batches.
* Micro-batches are formed by a token budget (``data.use_dynamic_bsz``) or a fixed row count.
* Checkpoints use the RL layout (``global_step_N/{actor,huggingface}`` + ``trainer_state.json``,
  written atomically by ``verl.trainer.ppo.checkpointing``); ``huggingface/`` holds merged weights
  (LoRA folded in) and the tokenizer, so it is a valid ``actor_rollout_ref.model.path``.

Multi-process: launch with ``torchrun --nproc_per_node N -m verl.trainer.fsdp_sft_trainer ...``;
each rank takes its share of every global batch.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import sys
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from verl.envs.registry import load_environment
from verl.trainer.ppo import checkpointing
from verl.trainer.run_exit import run_or_exit
from verl.trainer.sft_config import SFTConfig
from verl.utils import fsdp_utils, lora
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.config import ConfigError, to_plain, to_typed
from verl.utils.dataset.sft_dataset import (SFTDataset, collate_right_padded, fixed_size_batches,
                                            token_budget_batches)
from verl.utils.torch_functional import logprobs_from_logits, warmup_lr_lambda


def sft_loss_sum(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token NLL over loss-mask tokens of one right-padded micro-batch.

    The LM head runs from the first position that predicts a target of any row on
    (``logits_to_keep``): the prompt's positions before it have no (tokens x vocabulary) logits.

    Args:
        batch: ``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask``, each
            (batch, seq_len); ``loss_mask[t] == 1`` marks token ``t`` as a target.
    Returns:
        ``(nll_sum, num_tokens)``: scalar tensors (nats, count) on the model's device.
    """
    device = fsdp_utils.device_name()
    batch = {key: value.to(device) for key, value in batch.items()}
    targets = batch["loss_mask"][:, 1:]  # position t predicts token t + 1
    columns = targets.any(dim=0).nonzero()
    first = int(columns[0]) if len(columns) else targets.shape[1] - 1
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"], use_cache=False,
                   logits_to_keep=batch["input_ids"].shape[1] - first).logits  # positions first..end
    log_probs = logprobs_from_logits(logits[:, :-1], batch["input_ids"][:, first + 1:])
    mask = targets[:, first:].to(log_probs.dtype)
    return -(log_probs * mask).sum(), mask.sum()


def micro_batches(items: list[dict], data_cfg) -> list[list[dict]]:
    """Split one rank's examples into micro-batches (token budget or fixed size)."""
    if data_cfg.use_dynamic_bsz:
        groups = token_budget_batches([len(x["input_ids"]) for x in items], data_cfg.max_token_len_per_gpu)
    else:
        groups = fixed_size_batches(len(items), data_cfg.micro_batch_size_per_gpu)
    return [[items[i] for i in group] for group in groups]


def _all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        value = value.clone()
        dist.all_reduce(value)
    return value


class FSDPSFTTrainer:
    """SFT loop over ``SFTDataset`` with an FSDP2-sharded (optionally LoRA) causal LM.

    Args:
        config: an ``SFTConfig`` (or a mapping of its keys, typed here).
    Raises:
        ValueError: a malformed config, ``train_batch_size`` not divisible by the world size, bad
            data (see SFTDataset).
    """

    def __init__(self, config: Any):
        from transformers import AutoTokenizer

        self.config = config = to_typed(SFTConfig, config)
        fsdp_utils.init_distributed()
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        _seed_everything(config.trainer.seed)
        if config.data.train_batch_size % self.world_size:
            raise ValueError(f"data.train_batch_size={config.data.train_batch_size} is not divisible "
                             f"by the world size {self.world_size}")
        model_cfg = config.model
        self.tokenizer = AutoTokenizer.from_pretrained(model_cfg.tokenizer_path or model_cfg.path,
                                                       trust_remote_code=model_cfg.trust_remote_code)
        self.train_dataset = self._dataset(config.data.train_files)
        if len(self.train_dataset) < config.data.train_batch_size:
            raise ValueError(f"data.train_files has {len(self.train_dataset)} usable examples, fewer than "
                             f"data.train_batch_size={config.data.train_batch_size}")
        self.val_dataset = self._dataset(config.data.val_files) if config.data.val_files else None
        self.model = self._build_model()
        self.optimizer, self.scheduler = self._build_optimizer()
        self.checkpoint_manager = FSDPCheckpointManager(
            self.model, self.optimizer if config.trainer.save_optimizer else None, self.scheduler,
            self.tokenizer)
        self.global_step = 0

    def _dataset(self, files) -> SFTDataset:
        files = [files] if isinstance(files, str) else list(files)
        data = self.config.data
        return SFTDataset([os.path.expanduser(f) for f in files], self.tokenizer, data.max_length,
                          data.truncation, data.messages_key, data.prompt_key, data.response_key,
                          environment_text=load_environment(self.config.env.name, self.config.env.module).environment_text)

    def _build_model(self) -> torch.nn.Module:
        model_cfg = self.config.model
        model = fsdp_utils.load_causal_lm(model_cfg, torch_dtype=torch.float32, trainable=True)
        model = lora.maybe_wrap_lora(model, model_cfg)
        if lora.is_lora_model(model) and model_cfg.enable_gradient_checkpointing:
            model.enable_input_require_grads()  # checkpointed blocks need a grad-carrying input
        # SFT has no other phase to hand the GPU to between steps, so moving the whole model out and
        # back (the RL workers' param_offload) would only add copies: its one offload is FSDP2's
        # CPUOffloadPolicy, for a model whose training state does not fit the GPU.
        return fsdp_utils.apply_fsdp2(model, mixed_precision=model_cfg.fsdp_config.mixed_precision,
                                      offload_policy=model_cfg.fsdp_config.param_offload)

    def _build_optimizer(self):
        optim = self.config.optim
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas),
                                      weight_decay=optim.weight_decay)
        total = self.total_steps()
        schedule = warmup_lr_lambda(total, int(optim.warmup_steps_ratio * total), optim.lr_scheduler,
                                    optim.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return optimizer, scheduler

    def steps_per_epoch(self) -> int:
        return max(1, len(self.train_dataset) // self.config.data.train_batch_size)

    def total_steps(self) -> int:
        trainer = self.config.trainer
        if trainer.total_training_steps:
            return int(trainer.total_training_steps)
        return self.steps_per_epoch() * int(trainer.total_epochs)

    def _rank_share(self, indices: list[int]) -> list[dict]:
        share = len(indices) // self.world_size
        mine = indices[self.rank * share:(self.rank + 1) * share]
        return [self.train_dataset[i] for i in mine]

    def training_step(self, items: list[dict]) -> dict:
        """One optimizer step on this rank's examples of a global batch. Returns metrics."""
        self.model.train()
        pad = self.tokenizer.pad_token_id or 0
        groups = [collate_right_padded(g, pad) for g in micro_batches(items, self.config.data)]
        device = fsdp_utils.device_name()
        total_tokens = _all_reduce_sum(sum(g["loss_mask"][:, 1:].sum() for g in groups).float().to(device))
        nll_total = torch.zeros((), device=device)
        for group in groups:
            nll_sum, _ = sft_loss_sum(self.model, group)
            # FSDP averages gradients over ranks; scale so the result is the global token mean.
            (nll_sum * self.world_size / total_tokens.clamp_min(1)).backward()
            nll_total += nll_sum.detach()
        grad_norm, stepped = fsdp_utils.clip_grad_and_step(self.model, self.optimizer,
                                                           self.config.optim.clip_grad)
        self.scheduler.step()
        loss = _all_reduce_sum(nll_total) / total_tokens.clamp_min(1)
        return {"train/loss": float(loss), "train/grad_norm": grad_norm, "train/stepped": float(stepped),
                "train/lr": self.scheduler.get_last_lr()[0], "train/tokens": float(total_tokens),
                "train/micro_batches": len(groups)}

    @torch.no_grad()
    def validate(self) -> dict:
        """Token-mean NLL over the validation set (all ranks share the rows)."""
        self.model.eval()
        dataset = self.val_dataset
        mine = list(range(self.rank, len(dataset), self.world_size))
        nll = tokens = torch.zeros((), device=fsdp_utils.device_name())
        for group in micro_batches([dataset[i] for i in mine], self.config.data):
            nll_sum, count = sft_loss_sum(self.model, collate_right_padded(group, self.tokenizer.pad_token_id or 0))
            nll, tokens = nll + nll_sum, tokens + count
        return {"val/loss": float(_all_reduce_sum(nll) / _all_reduce_sum(tokens).clamp_min(1))}

    def save_checkpoint(self) -> Path:
        """Write ``global_step_N/{actor,huggingface}`` under ``trainer.default_local_dir``.

        ``actor/`` is written by the RL workers' ``FSDPCheckpointManager`` (DCP shards + per-rank
        extra state), so SFT and RL checkpoints have one format. Rank 0 drives the atomic step
        folder and tells the other ranks where to write; every part is collective.
        """
        trainer = self.config.trainer
        root = Path(os.path.expanduser(trainer.default_local_dir))
        if self.rank == 0:
            def save_workers(folder: Path) -> None:
                self._save_parts(_broadcast_path(folder))

            final = checkpointing.save_checkpoint(root, self.global_step, {"sft": True}, save_workers,
                                                  trainer.max_ckpt_to_keep)
        else:
            self._save_parts(_broadcast_path(None))
            final = checkpointing.step_dir(root, self.global_step)
        if self.world_size > 1:
            dist.barrier()
        return final

    def _save_parts(self, folder: Path) -> None:
        self.checkpoint_manager.save(folder / "actor", self.global_step)
        state = fsdp_utils.get_full_state_dict(self.model)
        if self.rank == 0:
            self.export_hf(state, folder / "huggingface")

    def export_hf(self, state: dict, folder: Path) -> Path:
        """Merged (LoRA folded in) HF folder with tokenizer; rank 0 only."""
        inner = self.model.base_model.model if lora.is_lora_model(self.model) else self.model
        scaling = lora.lora_scaling(self.model) if lora.is_lora_model(self.model) else None
        return lora.export_merged(state, inner.config, folder, scaling=scaling, tokenizer=self.tokenizer)

    def fit(self, tracker=None) -> dict:
        """Train for ``total_steps()``; validate/save per ``test_freq``/``save_freq`` and at the end.

        Rank 0 shows a progress bar over the steps (steps done, time per step, time left).
        """
        trainer, data = self.config.trainer, self.config.data
        total, metrics = self.total_steps(), {}
        generator = torch.Generator().manual_seed(trainer.seed)
        with tqdm(total=total, initial=self.global_step, desc="sft", unit="step", disable=self.rank != 0,
                  dynamic_ncols=True) as bar:
            while self.global_step < total:
                n = len(self.train_dataset)
                order = torch.randperm(n, generator=generator).tolist() if data.shuffle else list(range(n))
                for start in range(0, n - data.train_batch_size + 1, data.train_batch_size):
                    if self.global_step >= total:
                        break
                    started = time.perf_counter()
                    metrics = self.training_step(self._rank_share(order[start:start + data.train_batch_size]))
                    self.global_step += 1
                    metrics["train/step_time_s"] = time.perf_counter() - started
                    last = self.global_step == total
                    if self.val_dataset is not None and (last or _due(self.global_step, trainer.test_freq)):
                        metrics.update(self.validate())
                    if tracker is not None and self.rank == 0:
                        tracker.log(metrics, step=self.global_step)
                    if last or _due(self.global_step, trainer.save_freq):
                        metrics["checkpoint"] = str(self.save_checkpoint())
                    bar.set_postfix(loss=f"{metrics.get('train/loss', float('nan')):.3f}")
                    bar.update(1)
        return metrics


def _broadcast_path(folder: Path | None) -> Path:
    """Rank 0's ``folder`` on every rank."""
    holder = [str(folder) if folder is not None else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(holder, src=0)
    return Path(holder[0])


def _due(step: int, freq) -> bool:
    return bool(freq) and freq > 0 and step % freq == 0


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_sft(config: Any) -> dict:
    """Build the trainer from a config (``SFTConfig`` or mapping) and train. Returns the last step's metrics."""
    from verl.utils.tracking import Tracking

    trainer = FSDPSFTTrainer(config)
    config = trainer.config
    tracker = Tracking(config.trainer.project_name, config.trainer.experiment_name, list(config.trainer.logger),
                       os.path.expanduser(config.trainer.default_local_dir), to_plain(config))
    try:
        return trainer.fit(tracker)
    finally:
        tracker.finish()


def parse_config(overrides: Sequence[str]) -> SFTConfig:
    """``config/sft_trainer.yaml`` with command-line ``overrides``, typed.

    Raises:
        ConfigError: a malformed override, an unknown key or a wrong type, named.
    """
    from verl.trainer.overrides import compose

    return to_typed(SFTConfig, compose("sft_trainer", overrides))


def main(argv: Sequence[str] | None = None) -> None:
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    run_or_exit(lambda: run_sft(config))


if __name__ == "__main__":
    main()
