"""Data-parallel PPO critic: token-level values and the clipped value-loss update.

The model is an LM body with a one-unit head (``AutoModelForTokenClassification``,
``num_labels=1``). The value of response token ``t`` is the head's output at the position before
it (the state the token was generated from), so values align with log-probs: ``(B, R)``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import nn

from verl import algorithms
from verl.utils import torch_functional as F
from verl.utils.fsdp_utils import clip_grad_and_step
from verl.utils.seqlen_balancing import grad_accum_weights, restore_order
from verl.workers.batching import MicroBatching, UpdateBatching, micro_batches, mini_batches
from verl.workers.forward import ForwardLayout, forward_values


class DataParallelPPOCritic:
    """PPO critic over a (sharded) value model.

    Args:
        config: the ``CriticConfig`` (epochs, shuffling, clipping, value-clip range, aggregation).
        critic_module, critic_optimizer: the value model and its optimizer.
        layout: padded or packed forward (:class:`~verl.workers.forward.ForwardLayout`).
        update, forward: this rank's batching of the update and of the value forward.
    """

    def __init__(self, config: Any, critic_module: nn.Module, critic_optimizer: torch.optim.Optimizer,
                 layout: ForwardLayout, update: UpdateBatching, forward: MicroBatching):
        self.config = config
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.layout, self.update, self.forward = layout, update, forward

    @torch.no_grad()
    def compute_values(self, data) -> torch.Tensor:
        """Values ``(B, R)`` of ``data`` (rows in their original order), masked by ``response_mask``
        when present (values of observation tokens are not used by GAE)."""
        keys = [k for k in ("input_ids", "attention_mask", "position_ids", "responses") if k in data.batch.keys()]
        micros, partitions = micro_batches(data.batch.select(*keys), self.forward)
        was_training = self.critic_module.training
        self.critic_module.eval()
        values = restore_order([forward_values(self.critic_module, m, self.layout) for m in micros], partitions)
        self.critic_module.train(was_training)
        if "response_mask" in data.batch.keys():
            values = values * data.batch["response_mask"].to(values.dtype)
        return values

    def update_critic(self, data) -> dict[str, float]:
        """PPO value epochs: clipped value loss (``algorithms.compute_value_loss``), gradient
        accumulation weighted as for the actor, grad-norm clipping.

        Returns:
            ``critic/vf_loss``, ``critic/vf_clipfrac``, ``critic/vpred_mean``, ``critic/grad_norm``,
            ``critic/grad_norm_nonfinite`` averaged over mini-batches.
        """
        keys = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "values", "returns"]
        missing = [k for k in keys if k not in data.batch.keys()]
        if missing:
            raise KeyError(f"update_critic needs batch keys {missing} (has {sorted(data.batch.keys())})")
        metrics: dict[str, list[float]] = defaultdict(list)
        self.critic_module.train()
        for mini in mini_batches(data.batch.select(*keys), self.update, self.config.ppo_epochs, self.config.shuffle):
            for key, value in self._update_mini_batch(mini).items():
                metrics[key].append(value)
        return {key: sum(values) / len(values) for key, values in metrics.items()}

    def _update_mini_batch(self, mini) -> dict[str, float]:
        micros, _ = micro_batches(mini, self.update.micro)
        loss_agg_mode = self.config.loss_agg_mode
        weights = grad_accum_weights([m["response_mask"] for m in micros], loss_agg_mode)
        self.critic_optimizer.zero_grad(set_to_none=True)
        sums: dict[str, Any] = defaultdict(float)  # 0-d tensors until one host sync per mini-batch
        for micro, weight in zip(micros, weights):
            mask = micro["response_mask"].to(torch.float32)
            vpreds = forward_values(self.critic_module, micro, self.layout)
            vf_loss, vf_clipfrac = algorithms.compute_value_loss(
                vpreds, micro["returns"], micro["values"], mask, self.config.cliprange_value, loss_agg_mode)
            (vf_loss * weight).backward()
            sums["critic/vf_loss"] += vf_loss.detach() * weight
            sums["critic/vf_clipfrac"] += vf_clipfrac / len(micros)
            sums["critic/vpred_mean"] += F.masked_mean(vpreds.detach(), mask) / len(micros)
        sums = F.metrics_to_floats(sums)
        grad_norm, stepped = clip_grad_and_step(self.critic_module, self.critic_optimizer, self.config.grad_clip)
        sums["critic/grad_norm"] = grad_norm
        sums["critic/grad_norm_nonfinite"] = 0.0 if stepped else 1.0
        return dict(sums)
