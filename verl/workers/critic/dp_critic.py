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

from verl.trainer.ppo import core_algos
from verl.utils import torch_functional as F
from verl.utils.fsdp_utils import clip_grad_and_step
from verl.utils.seqlen_balancing import grad_accum_weights, restore_order, split_micro_batches
from verl.utils.varlen_attention import packed_row_len


def forward_values(model: nn.Module, micro: Any, use_remove_padding: bool = False,
                   max_packed_row_len: int = 0) -> torch.Tensor:
    """Values ``(B, R)`` of one micro-batch (0 where the response token is padding).

    Args:
        micro: mapping with ``input_ids``, ``attention_mask``, ``position_ids`` ``(B, T)`` and
            ``responses`` ``(B, R)``.
        max_packed_row_len: with ``use_remove_padding``, pack into rows of at most this many tokens
            (0: one row); keeps sdpa's dense block-diagonal mask small (see
            :func:`verl.utils.torch_functional.pack_sequences_rows`).
    """
    input_ids, attention_mask = micro["input_ids"], micro["attention_mask"]
    position_ids = micro["position_ids"] if "position_ids" in micro.keys() else F.position_ids_from_mask(attention_mask)
    batch, seqlen = input_ids.shape
    response_length = micro["responses"].shape[1]
    if use_remove_padding:
        row_len = packed_row_len(model, max_packed_row_len, input_ids.numel())
        packed_ids, packed_pos, src, dst = F.pack_sequences_rows(input_ids, attention_mask, position_ids, row_len)
        out = model(input_ids=packed_ids, position_ids=packed_pos, use_cache=False).logits[..., 0]
        values = F.pad_packed(out.reshape(-1)[dst].float(), src, batch, seqlen)
    else:
        values = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False).logits[..., 0].float()
    values = F.response_slice(values, response_length)
    return values * attention_mask[:, -response_length:].to(values.dtype)


class DataParallelPPOCritic:
    """PPO critic over a (sharded) value model.

    Args:
        config: the ``critic`` node with per-rank sizes (``ppo_mini_batch_size`` rows,
            ``ppo_micro_batch_size_per_gpu``, ``forward_micro_batch_size_per_gpu``,
            ``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu``, ``forward_max_token_len_per_gpu``),
            ``ppo_epochs``, ``shuffle``, ``grad_clip``, ``cliprange_value``, ``loss_agg_mode``,
            ``use_remove_padding``.
    """

    def __init__(self, config: Any, critic_module: nn.Module, critic_optimizer: torch.optim.Optimizer):
        self.config = config
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.use_remove_padding = bool(config.get("use_remove_padding", False))
        self.max_packed_row_len = int(config.get("max_packed_row_len", 0) or 0)

    def _split(self, batch, micro_size, max_tokens):
        use_dynamic = bool(self.config.get("use_dynamic_bsz", False))
        return split_micro_batches(batch, micro_batch_size=micro_size, max_token_len=max_tokens if use_dynamic else None)

    @torch.no_grad()
    def compute_values(self, data) -> torch.Tensor:
        """Values ``(B, R)`` of ``data`` (rows in their original order), masked by ``response_mask``
        when present (values of observation tokens are not used by GAE)."""
        keys = [k for k in ("input_ids", "attention_mask", "position_ids", "responses") if k in data.batch.keys()]
        micros, partitions = self._split(data.batch.select(*keys),
                                         self.config.get("forward_micro_batch_size_per_gpu"),
                                         self.config.get("forward_max_token_len_per_gpu")
                                         or self.config.get("ppo_max_token_len_per_gpu"))
        was_training = self.critic_module.training
        self.critic_module.eval()
        values = restore_order([forward_values(self.critic_module, m, self.use_remove_padding, self.max_packed_row_len)
                                for m in micros],
                               partitions)
        self.critic_module.train(was_training)
        if "response_mask" in data.batch.keys():
            values = values * data.batch["response_mask"].to(values.dtype)
        return values

    def update_critic(self, data) -> dict[str, float]:
        """PPO value epochs: clipped value loss (``core_algos.compute_value_loss``), gradient
        accumulation weighted as for the actor, grad-norm clipping.

        Returns:
            ``critic/vf_loss``, ``critic/vf_clipfrac``, ``critic/vpred_mean``, ``critic/grad_norm``,
            ``critic/grad_norm_nonfinite`` averaged over mini-batches.
        """
        keys = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "values", "returns"]
        missing = [k for k in keys if k not in data.batch.keys()]
        if missing:
            raise KeyError(f"update_critic needs batch keys {missing} (has {sorted(data.batch.keys())})")
        batch = data.batch.select(*keys)
        mini_size = int(self.config.get("ppo_mini_batch_size"))
        metrics: dict[str, list[float]] = defaultdict(list)
        self.critic_module.train()
        for epoch in range(int(self.config.get("ppo_epochs", 1))):
            epoch_batch = batch
            if self.config.get("shuffle", False):
                gen = torch.Generator().manual_seed(int(self.config.get("seed", 0)) + epoch)
                epoch_batch = batch[torch.randperm(batch.batch_size[0], generator=gen)]
            for start in range(0, epoch_batch.batch_size[0], mini_size):
                for key, value in self._update_mini_batch(epoch_batch[start:start + mini_size]).items():
                    metrics[key].append(value)
        return {key: sum(values) / len(values) for key, values in metrics.items()}

    def _update_mini_batch(self, mini) -> dict[str, float]:
        micros, _ = self._split(mini, self.config.get("ppo_micro_batch_size_per_gpu"),
                                self.config.get("ppo_max_token_len_per_gpu"))
        loss_agg_mode = self.config.get("loss_agg_mode", "token-mean")
        weights = grad_accum_weights([m["response_mask"] for m in micros], loss_agg_mode)
        self.critic_optimizer.zero_grad(set_to_none=True)
        sums: dict[str, Any] = defaultdict(float)  # 0-d tensors until one host sync per mini-batch
        for micro, weight in zip(micros, weights):
            mask = micro["response_mask"].to(torch.float32)
            vpreds = forward_values(self.critic_module, micro, self.use_remove_padding, self.max_packed_row_len)
            vf_loss, vf_clipfrac = core_algos.compute_value_loss(
                vpreds, micro["returns"], micro["values"], mask, float(self.config.get("cliprange_value", 0.5)),
                loss_agg_mode)
            (vf_loss * weight).backward()
            sums["critic/vf_loss"] += vf_loss.detach() * weight
            sums["critic/vf_clipfrac"] += vf_clipfrac / len(micros)
            sums["critic/vpred_mean"] += F.masked_mean(vpreds.detach(), mask) / len(micros)
        sums = F.metrics_to_floats(sums)
        grad_norm, stepped = clip_grad_and_step(self.critic_module, self.critic_optimizer, self.config.get("grad_clip"))
        sums["critic/grad_norm"] = grad_norm
        sums["critic/grad_norm_nonfinite"] = 0.0 if stepped else 1.0
        return dict(sums)
