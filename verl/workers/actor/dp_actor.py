"""Data-parallel PPO actor: log-probs of response tokens and the clipped policy update.

The model is a Hugging Face causal LM, usually sharded with FSDP2; everything here is per rank and
data-parallel (each rank holds its own rows; FSDP averages gradients). The forward pass and its
layouts are :mod:`verl.workers.forward`; the per-rank batch sizes come from
:mod:`verl.workers.batching`. Shapes: B rows, T = P + R (prompt left-padded to P, response
right-padded to R).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from verl import algorithms
from verl.utils import torch_functional as F
from verl.utils.fsdp_utils import clip_grad_and_step
from verl.utils.seqlen_balancing import grad_accum_weights, restore_order
from verl.workers.batching import MicroBatching, UpdateBatching, micro_batches, mini_batches
from verl.workers.forward import ForwardLayout, forward_log_probs

logger = logging.getLogger(__name__)

_FORWARD_KEYS = ["input_ids", "attention_mask", "position_ids", "responses"]
POS_LOGPROB_SUM, POS_LOGPROB_ROWS = "actor/pos_logprob_sum", "actor/pos_logprob_rows"
# summed over micro-batches (not averaged), so that their ratio stays exact after the averages over
# mini-batches and ranks
SUMMED_METRICS = (POS_LOGPROB_SUM, POS_LOGPROB_ROWS)


def positive_row_log_probs(log_probs: torch.Tensor, advantages: torch.Tensor,
                           response_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The sums behind the health monitor's ``lld/pos_logprob`` (``verl.trainer.ppo.health``).

    Args:
        log_probs: the sampling policy's token log-probs, ``(batch, response_len)``.
        advantages: ``(batch, response_len)``; a row counts when its mean over the mask is > 0.
        response_mask: 1 on generated tokens, ``(batch, response_len)``.
    Returns:
        0-d tensors: ``POS_LOGPROB_SUM``, the sum over those rows of their mean token log-prob (nats),
        and ``POS_LOGPROB_ROWS``, their number.
    """
    mask = response_mask.to(torch.float32)
    tokens = mask.sum(-1)
    row_log_prob = (log_probs.detach().float() * mask).sum(-1) / tokens.clamp_min(1.0)
    row_advantage = (advantages.float() * mask).sum(-1) / tokens.clamp_min(1.0)
    positive = ((row_advantage > 0) & (tokens > 0)).to(torch.float32)
    return {POS_LOGPROB_SUM: (row_log_prob * positive).sum(), POS_LOGPROB_ROWS: positive.sum()}


class DataParallelPPOActor:
    """PPO actor over a (sharded) causal LM.

    Args:
        config: the ``ActorConfig`` (loss, KL, entropy, TIS, epochs, clipping).
        actor_module: the model (FSDP2-wrapped or plain).
        actor_optimizer: None for a frozen model (reference: log-probs only).
        layout: the model's :class:`~verl.workers.forward.ForwardLayout`.
        update: this rank's :class:`~verl.workers.batching.UpdateBatching` (required to update).
    """

    def __init__(self, config: Any, actor_module: nn.Module, actor_optimizer: torch.optim.Optimizer | None = None,
                 layout: ForwardLayout | None = None, update: UpdateBatching | None = None):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.layout = layout or ForwardLayout()
        self.update = update

    def _forward(self, micro, temperature: float, calculate_entropy: bool):
        return forward_log_probs(self.actor_module, micro, temperature, self.layout, calculate_entropy)

    # ------------------------------------------------------------------ log-probs
    @torch.no_grad()
    def compute_log_prob(self, data, micro: MicroBatching, temperature: float,
                         calculate_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs ``(B, R)`` (and entropy ``(B, R)`` or None) of ``data.batch["responses"]``.

        ``micro`` says how this rank's rows are split; ``temperature`` divides the logits (the
        rollout's sampling temperature). Rows come back in their original order.
        """
        batch = data.batch.select(*[k for k in _FORWARD_KEYS if k in data.batch.keys()])
        micros, partitions = micro_batches(batch, micro)
        was_training = self.actor_module.training
        self.actor_module.eval()
        log_probs, entropys = [], []
        for chunk in micros:
            lp, ent = self._forward(chunk, temperature, calculate_entropy)
            log_probs.append(lp)
            entropys.append(ent)
        self.actor_module.train(was_training)
        log_probs = restore_order(log_probs, partitions)
        entropy = restore_order(entropys, partitions) if calculate_entropy else None
        return log_probs, entropy

    # ------------------------------------------------------------------ update
    def _select_update_keys(self, data):
        keys = _FORWARD_KEYS + ["response_mask", "advantages"]
        if "old_log_probs" in data.batch.keys() or not self._single_update(data):
            keys.append("old_log_probs")
        if self.config.use_kl_loss:
            keys.append("ref_log_probs")
        if self.config.tis_imp_ratio_cap > 0:
            keys.append("rollout_log_probs")
        missing = [k for k in keys if k not in data.batch.keys()]
        if missing:
            raise KeyError(f"update_policy needs batch keys {missing} (has {sorted(data.batch.keys())})")
        return data.batch.select(*[k for k in keys if k in data.batch.keys()])

    def _single_update(self, data) -> bool:
        """One epoch and one mini-batch: the update runs on the parameters that generated the data."""
        return self.config.ppo_epochs == 1 and int(data.batch.batch_size[0]) <= self.update.mini_batch_rows

    def update_policy(self, data, temperature: float) -> dict[str, float]:
        """PPO epochs over mini-batches, gradient accumulation over micro-batches.

        Without ``old_log_probs`` in the batch (allowed only for one epoch over one mini-batch,
        where they would equal the current policy's), the ratio's denominator is the update's own
        log-probs, detached: ratio 1, the same gradient as with recomputed ``old_log_probs``.

        Loss per micro-batch (Schulman et al. 2017): the registered policy loss
        (``policy_loss.loss_mode``, default ``vanilla`` clipped surrogate) optionally weighted by
        truncated importance weights, ``- entropy_coeff * entropy`` and ``+ kl_loss_coef * KL(pi ||
        pi_ref)`` and ``+ llds.coef * L_LLDS`` (:mod:`verl.algorithms.llds`), each aggregated with
        ``loss_agg_mode``. Micro-batch losses are weighted by :func:`grad_accum_weights` so the step
        equals one step on the whole mini-batch.

        Returns:
            Metrics averaged over mini-batches: ``actor/pg_loss``, ``actor/pg_clipfrac``,
            ``actor/ppo_kl``, ``actor/entropy``, ``actor/kl_loss`` (with KL loss), ``actor/llds_loss``
            and ``actor/llds_active_tokens`` (with LLDS), ``actor/grad_norm``, ``actor/grad_norm_nonfinite`` (share of skipped steps), plus the
            importance-sampling metrics with TIS.
        Raises:
            RuntimeError: the actor was built without an optimizer or update batching.
        """
        if self.actor_optimizer is None or self.update is None:
            raise RuntimeError("update_policy called on an actor built without an optimizer and update batching")
        metrics: dict[str, list[float]] = defaultdict(list)
        self.actor_module.train()
        for mini in mini_batches(self._select_update_keys(data), self.update, self.config.ppo_epochs,
                                 self.config.shuffle):
            for key, value in self._update_mini_batch(mini, temperature).items():
                metrics[key].append(value)
        return {key: sum(values) / len(values) for key, values in metrics.items()}

    def _update_mini_batch(self, mini, temperature: float) -> dict[str, float]:
        micros, _ = micro_batches(mini, self.update.micro)
        loss_agg_mode = self.config.loss_agg_mode
        weights = grad_accum_weights([m["response_mask"] for m in micros], loss_agg_mode)
        self.actor_optimizer.zero_grad(set_to_none=True)
        # Metrics stay on the device (0-d tensors) until the end of the mini-batch: one host sync.
        sums: dict[str, Any] = defaultdict(float)
        for micro, weight in zip(micros, weights):
            loss, micro_metrics = self._micro_batch_loss(micro, temperature, loss_agg_mode)
            (loss * weight).backward()
            sums["actor/pg_loss"] += micro_metrics.pop("actor/pg_loss") * weight
            for key, value in micro_metrics.items():
                sums[key] += value if key in SUMMED_METRICS else value / len(micros)
        sums = F.metrics_to_floats(sums)
        grad_norm, stepped = clip_grad_and_step(self.actor_module, self.actor_optimizer, self.config.grad_clip)
        if not stepped:
            logger.warning("actor grad norm is %s: optimizer step skipped", grad_norm)
        sums["actor/grad_norm"] = grad_norm
        sums["actor/num_micro_batches"] = float(len(micros))
        sums["actor/grad_norm_nonfinite"] = 0.0 if stepped else 1.0
        return dict(sums)

    def _micro_batch_loss(self, micro, temperature: float, loss_agg_mode: str) -> tuple[torch.Tensor, dict[str, Any]]:
        cfg = self.config
        response_mask = micro["response_mask"].to(torch.float32)
        log_prob, entropy = self._forward(micro, temperature, calculate_entropy=True)
        old_log_prob = micro["old_log_probs"] if "old_log_probs" in micro.keys() else log_prob.detach()
        metrics: dict[str, Any] = {}  # floats or 0-d tensors (synced once per mini-batch)
        is_weights = None
        if cfg.tis_imp_ratio_cap > 0:
            is_weights, is_metrics = algorithms.compute_rollout_is_weights(
                old_log_prob, micro["rollout_log_probs"], response_mask, cap=cfg.tis_imp_ratio_cap,
                level=cfg.tis_level, mode=cfg.tis_mode)
            metrics.update({f"actor/{k}": v for k, v in is_metrics.items()})
        pg_loss, pg_metrics = algorithms.get_policy_loss_fn(cfg.policy_loss.loss_mode)(
            old_log_prob, log_prob, micro["advantages"], response_mask, loss_agg_mode, cfg,
            rollout_is_weights=is_weights)
        metrics.update(pg_metrics)
        entropy_loss = algorithms.agg_loss(entropy, response_mask, loss_agg_mode)
        metrics["actor/entropy"] = entropy_loss.detach()
        loss = pg_loss
        if cfg.entropy_coeff != 0:
            loss = loss - cfg.entropy_coeff * entropy_loss
        if cfg.use_kl_loss:
            kl = algorithms.kl_penalty(log_prob, micro["ref_log_probs"], cfg.kl_loss_type)
            kl_loss = algorithms.agg_loss(kl, response_mask, loss_agg_mode)
            loss = loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
            metrics["actor/kl_coef"] = cfg.kl_loss_coef
        if cfg.llds.coef > 0:
            llds_loss, llds_metrics = algorithms.compute_llds_loss(
                old_log_prob, log_prob, micro["advantages"], response_mask, cfg.llds.gate, loss_agg_mode)
            loss = loss + cfg.llds.coef * llds_loss
            metrics.update(llds_metrics)
        metrics["actor/pg_loss"] = pg_loss.detach()
        metrics.update(positive_row_log_probs(old_log_prob, micro["advantages"], response_mask))
        return loss, metrics
