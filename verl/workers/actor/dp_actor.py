"""Data-parallel PPO actor: log-probs of response tokens and the clipped policy update.

The model is a Hugging Face causal LM, usually sharded with FSDP2; everything here is per rank and
data-parallel (each rank holds its own rows; FSDP averages gradients). Shapes: B rows, T = P + R
(prompt left-padded to P, response right-padded to R).

Two forward layouts give the same numbers:

* padded: ``model(input_ids, attention_mask, position_ids)`` on ``(B, T)``;
* ``use_remove_padding``: valid tokens of all rows packed into one ``(1, N)`` row with per-row
  restarting ``position_ids`` and no attention mask; transformers then builds a block-diagonal
  causal mask (sdpa/eager) or varlen flash attention, so no compute goes to padding.
  With ``share_prompts`` (sdpa/eager only), rows with the same prompt share one copy of it under
  a custom mask (:mod:`verl.utils.prefix_sharing`), so a GRPO group's prompt is computed once.

Log-probs and entropies are 0 where the *target* response token is padding, in both layouts.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from verl.trainer.ppo import core_algos
from verl.utils import torch_functional as F
from verl.utils.prefix_sharing import pack_shared_prompts, supports_custom_mask
from verl.utils.seqlen_balancing import grad_accum_weights, restore_order, split_micro_batches
from verl.utils.varlen_attention import packed_row_len

logger = logging.getLogger(__name__)

_FORWARD_KEYS = ["input_ids", "attention_mask", "position_ids", "responses"]


def forward_log_probs(model: nn.Module, micro: Any, temperature: float = 1.0, use_remove_padding: bool = False,
                      calculate_entropy: bool = False, logits_chunk_size: int = 0,
                      max_packed_row_len: int = 0, packed_row_multiple: int = 1,
                      share_prompts: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the response tokens of one micro-batch.

    Args:
        model: causal LM returning ``.logits`` ``(B, T, V)``.
        micro: mapping with ``input_ids``, ``attention_mask``, ``position_ids`` ``(B, T)`` and
            ``responses`` ``(B, R)``.
        temperature: the sampling temperature; logits are divided by it so the log-probs are those
            of the distribution the rollout sampled from.
        logits_chunk_size: > 0: take the LM head's input (last hidden states) and compute logits
            only for the response-predicting positions, ``logits_chunk_size`` tokens at a time
            (:func:`verl.utils.torch_functional.chunked_logprobs_entropy`); the full ``(B, T, V)``
            logits never exist. Falls back to full logits when the head is not a plain
            ``nn.Linear`` or the model post-processes logits (soft-capping, scaling). The scores
            are returned through the model's output (in place of its logits), so FSDP2 re-gathers
            the head weight before their backward as it would for logits.
        max_packed_row_len: with ``use_remove_padding``, pack into rows of at most this many
            tokens (0: one row) so sdpa's dense block-diagonal mask stays ``O(row_len^2)``;
            ``packed_row_multiple`` rounds the row length up (few distinct shapes for compiled
            attention kernels such as flex attention).
        share_prompts: with ``use_remove_padding`` and sdpa/eager attention, rows with the same
            prompt share one copy of it in the packed rows
            (:func:`verl.utils.prefix_sharing.pack_shared_prompts`); same numbers, less compute
            when ``rollout.n > 1``.
    Returns:
        ``log_probs`` ``(B, R)`` and ``entropy`` ``(B, R)`` (or None), in nats, 0 where the response
        token is padding.
    """
    input_ids, attention_mask = micro["input_ids"], micro["attention_mask"]
    position_ids = micro["position_ids"] if "position_ids" in micro.keys() else F.position_ids_from_mask(attention_mask)
    batch, seqlen = input_ids.shape
    response_length = micro["responses"].shape[1]
    labels = F.next_token_labels(input_ids)
    inputs, src, dst = _model_inputs(model, input_ids, attention_mask, position_ids, seqlen - response_length,
                                     use_remove_padding, share_prompts, max_packed_row_len, packed_row_multiple)
    head = _plain_lm_head(model) if logits_chunk_size > 0 else None
    if head is not None:
        log_probs, entropy = _chunked_response_stats(model, head, inputs, labels, attention_mask, response_length,
                                                     src, dst, temperature, logits_chunk_size, calculate_entropy)
    elif use_remove_padding:
        log_probs, entropy = _packed_full_logits_stats(model, inputs, labels, src, dst, batch, seqlen,
                                                       response_length, temperature, calculate_entropy)
    else:
        logits = model(**inputs, use_cache=False).logits
        logits = F.response_slice(logits, response_length).float() / temperature
        log_probs = F.logprobs_from_logits(logits, F.response_slice(labels, response_length))
        entropy = F.entropy_from_logits(logits) if calculate_entropy else None
    # Targets that are padding have meaningless (and layout-dependent) values: zero them.
    target_valid = attention_mask[:, -response_length:].to(log_probs.dtype)
    log_probs = log_probs * target_valid
    if entropy is not None:
        entropy = entropy * target_valid
    return log_probs, entropy


def _model_inputs(model, input_ids, attention_mask, position_ids, prompt_length: int, use_remove_padding: bool,
                  share_prompts: bool, max_packed_row_len: int, packed_row_multiple: int):
    """The forward's inputs in the chosen layout, with ``src``/``dst`` token maps (None when padded)."""
    if not use_remove_padding:
        return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}, None, None
    row_len = packed_row_len(model, max_packed_row_len, input_ids.numel())
    if share_prompts and supports_custom_mask(model):
        ids, pos, src, dst, mask = pack_shared_prompts(input_ids, attention_mask, position_ids, prompt_length, row_len)
        return {"input_ids": ids, "position_ids": pos, "attention_mask": mask}, src, dst
    ids, pos, src, dst = F.pack_sequences_rows(input_ids, attention_mask, position_ids, row_len, packed_row_multiple)
    return {"input_ids": ids, "position_ids": pos}, src, dst


def _packed_full_logits_stats(model, inputs, labels, src, dst, batch: int, seqlen: int, response_length: int,
                              temperature: float, calculate_entropy: bool):
    """Full-vocabulary logits of packed rows, unpacked to ``(B, R)`` log-probs (and entropy)."""
    logits = model(**inputs, use_cache=False).logits
    logits = logits.reshape(-1, logits.shape[-1])[dst].float() / temperature
    log_probs = F.pad_packed(F.logprobs_from_logits(logits, labels.reshape(-1)[src]), src, batch, seqlen)
    entropy = None
    if calculate_entropy:
        entropy = F.response_slice(F.pad_packed(F.entropy_from_logits(logits), src, batch, seqlen), response_length)
    return F.response_slice(log_probs, response_length), entropy


def _plain_lm_head(model: nn.Module) -> nn.Linear | None:
    """The output head if logits are exactly ``head(hidden)``, else None (use full logits)."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if type(head) is not nn.Linear:
        return None
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None) not in (None, 1, 1.0):
        return None
    return head


def _chunked_response_stats(model, head, inputs, labels, attention_mask, response_length, src, dst,
                            temperature, chunk_size, calculate_entropy):
    """Run the body, capture the head's input, and score only the response-predicting positions."""
    batch, seqlen = attention_mask.shape
    mask = attention_mask.bool()
    # Output t predicts token t+1: keep t in the response range where both t and t+1 are real tokens.
    want = torch.zeros_like(mask)
    first = seqlen - response_length - 1
    want[:, first:seqlen - 1] = mask[:, first:seqlen - 1] & mask[:, first + 1:]
    wanted = torch.nonzero(want.reshape(-1)).squeeze(-1)
    if src is None:
        hidden_index = wanted
    else:
        lookup = torch.full((batch * seqlen,), -1, dtype=torch.long, device=wanted.device)
        lookup[src] = dst
        hidden_index = lookup[wanted]
    captured = {}

    def keep_hidden(module, args):
        captured["hidden"] = args[0]
        return (args[0][..., :0, :],)  # the head itself then produces empty logits

    def score(module, args, output):
        # Runs inside the model's forward (weights gathered) and becomes the model's "logits", so
        # FSDP's pre-backward hook on the output re-gathers the weight for the chunks' recompute.
        hidden = captured.pop("hidden")
        hidden = hidden.reshape(-1, hidden.shape[-1])[hidden_index]
        lp, ent = F.chunked_logprobs_entropy(hidden, module.weight, labels.reshape(-1)[wanted], module.bias,
                                             temperature, chunk_size, calculate_entropy)
        ent = ent if ent is not None else torch.zeros_like(lp)
        return torch.stack([lp[None], ent[None]], dim=-1)  # (1, n, 2), a fresh tensor (not a view)

    handles = [head.register_forward_pre_hook(keep_hidden), head.register_forward_hook(score)]
    try:
        stats = model(**inputs, use_cache=False).logits[0]
    finally:
        for handle in handles:
            handle.remove()
    lp, ent = stats[:, 0], (stats[:, 1] if calculate_entropy else None)

    def to_response(values):
        full = values.new_zeros(batch * seqlen).index_copy(0, wanted, values)
        return F.response_slice(full.view(batch, seqlen), response_length)

    return to_response(lp), (to_response(ent) if ent is not None else None)


class DataParallelPPOActor:
    """PPO actor over a (sharded) causal LM.

    Args:
        config: the ``actor`` config node, with batch sizes already per rank (the worker
            normalises them): ``ppo_mini_batch_size`` (rows), ``ppo_micro_batch_size_per_gpu``,
            ``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu``, ``ppo_epochs``, ``shuffle``,
            ``grad_clip``, ``clip_ratio*``, ``entropy_coeff``, ``loss_agg_mode``, ``use_kl_loss``,
            ``kl_loss_coef``, ``kl_loss_type``, ``tis_imp_ratio_cap`` (> 0 enables truncated IS),
            ``tis_level``, ``tis_mode``, ``policy_loss.loss_mode``, ``use_remove_padding``; speed only
            (same numbers): ``logits_chunk_size`` (default 4096, 0 = full logits),
            ``max_packed_row_len`` (default 0 = one packed row), ``packed_row_multiple`` (default 1),
            ``share_prompts`` (default False).
        actor_module: the model (FSDP2-wrapped or plain).
        actor_optimizer: None for a frozen model (reference: log-probs only).
    """

    def __init__(self, config: Any, actor_module: nn.Module, actor_optimizer: torch.optim.Optimizer | None = None):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.use_remove_padding = bool(config.get("use_remove_padding", False))
        # Performance knobs (same numbers either way): see forward_log_probs.
        self.logits_chunk_size = int(config.get("logits_chunk_size", 4096) or 0)
        self.max_packed_row_len = int(config.get("max_packed_row_len", 0) or 0)
        self.packed_row_multiple = int(config.get("packed_row_multiple", 1) or 1)
        self.share_prompts = bool(config.get("share_prompts", False))

    def _forward(self, micro, temperature: float, calculate_entropy: bool):
        return forward_log_probs(self.actor_module, micro, temperature, self.use_remove_padding, calculate_entropy,
                                 self.logits_chunk_size, self.max_packed_row_len, self.packed_row_multiple,
                                 self.share_prompts)

    # ------------------------------------------------------------------ log-probs
    def _micro_batches(self, batch, micro_batch_size: int | None, use_dynamic_bsz: bool, max_token_len: int | None):
        return split_micro_batches(batch, micro_batch_size=micro_batch_size,
                                   max_token_len=max_token_len if use_dynamic_bsz else None)

    @torch.no_grad()
    def compute_log_prob(self, data, calculate_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs ``(B, R)`` (and entropy ``(B, R)`` or None) of ``data.batch["responses"]``.

        ``data.meta_info`` may give ``micro_batch_size``, ``use_dynamic_bsz``, ``max_token_len``
        and ``temperature`` (default: the actor config's values, temperature 1). Rows come back in
        their original order whatever the micro-batching.
        """
        meta = data.meta_info
        use_dynamic = bool(meta.get("use_dynamic_bsz", self.config.get("use_dynamic_bsz", False)))
        micro_size = meta.get("micro_batch_size") or self.config.get("log_prob_micro_batch_size_per_gpu") \
            or self.config.get("ppo_micro_batch_size_per_gpu")
        max_tokens = meta.get("max_token_len") or self.config.get("ppo_max_token_len_per_gpu")
        batch = data.batch.select(*[k for k in _FORWARD_KEYS if k in data.batch.keys()])
        micros, partitions = self._micro_batches(batch, micro_size, use_dynamic, max_tokens)
        was_training = self.actor_module.training
        self.actor_module.eval()
        log_probs, entropys = [], []
        for micro in micros:
            lp, ent = self._forward(micro, float(meta.get("temperature", 1.0)), calculate_entropy)
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
        if self.config.get("use_kl_loss", False):
            keys.append("ref_log_probs")
        if float(self.config.get("tis_imp_ratio_cap", 0) or 0) > 0:
            keys.append("rollout_log_probs")
        missing = [k for k in keys if k not in data.batch.keys()]
        if missing:
            raise KeyError(f"update_policy needs batch keys {missing} (has {sorted(data.batch.keys())})")
        return data.batch.select(*[k for k in keys if k in data.batch.keys()])

    def _single_update(self, data) -> bool:
        """One epoch and one mini-batch: the update runs on the parameters that generated the data."""
        return int(self.config.get("ppo_epochs", 1)) == 1 and \
            int(data.batch.batch_size[0]) <= int(self.config.get("ppo_mini_batch_size"))

    def update_policy(self, data) -> dict[str, float]:
        """PPO epochs over mini-batches, gradient accumulation over micro-batches.

        Without ``old_log_probs`` in the batch (allowed only for one epoch over one mini-batch,
        where they would equal the current policy's), the ratio's denominator is the update's own
        log-probs, detached: ratio 1, the same gradient as with recomputed ``old_log_probs``.

        Loss per micro-batch (Schulman et al. 2017): the registered policy loss
        (``policy_loss.loss_mode``, default ``vanilla`` clipped surrogate) optionally weighted by
        truncated importance weights, ``- entropy_coeff * entropy`` and ``+ kl_loss_coef * KL(pi ||
        pi_ref)``, each aggregated with ``loss_agg_mode``. Micro-batch losses are weighted by
        :func:`grad_accum_weights` so the step equals one step on the whole mini-batch.

        Returns:
            Metrics averaged over mini-batches: ``actor/pg_loss``, ``actor/pg_clipfrac``,
            ``actor/ppo_kl``, ``actor/entropy``, ``actor/kl_loss`` (with KL loss),
            ``actor/grad_norm``, ``actor/grad_norm_nonfinite`` (share of skipped steps), plus the
            importance-sampling metrics with TIS.
        """
        if self.actor_optimizer is None:
            raise RuntimeError("update_policy called on an actor built without an optimizer")
        batch = self._select_update_keys(data)
        temperature = float(data.meta_info.get("temperature", 1.0))
        mini_size = int(self.config.get("ppo_mini_batch_size"))
        metrics: dict[str, list[float]] = defaultdict(list)
        self.actor_module.train()
        for epoch in range(int(self.config.get("ppo_epochs", 1))):
            epoch_batch = batch
            if self.config.get("shuffle", False):
                gen = torch.Generator().manual_seed(int(self.config.get("seed", 0)) + epoch)
                epoch_batch = batch[torch.randperm(batch.batch_size[0], generator=gen)]
            for start in range(0, epoch_batch.batch_size[0], mini_size):
                mini = epoch_batch[start:start + mini_size]
                for key, value in self._update_mini_batch(mini, temperature).items():
                    metrics[key].append(value)
        return {key: sum(values) / len(values) for key, values in metrics.items()}

    def _update_mini_batch(self, mini, temperature: float) -> dict[str, float]:
        micros, _ = self._micro_batches(mini, self.config.get("ppo_micro_batch_size_per_gpu"),
                                        bool(self.config.get("use_dynamic_bsz", False)),
                                        self.config.get("ppo_max_token_len_per_gpu"))
        loss_agg_mode = self.config.get("loss_agg_mode", "token-mean")
        weights = grad_accum_weights([m["response_mask"] for m in micros], loss_agg_mode)
        self.actor_optimizer.zero_grad(set_to_none=True)
        # Metrics stay on the device (0-d tensors) until the end of the mini-batch: one host sync.
        sums: dict[str, Any] = defaultdict(float)
        for micro, weight in zip(micros, weights):
            loss, micro_metrics = self._micro_batch_loss(micro, temperature, loss_agg_mode)
            (loss * weight).backward()
            sums["actor/pg_loss"] += micro_metrics.pop("actor/pg_loss") * weight
            for key, value in micro_metrics.items():
                sums[key] += value / len(micros)
        sums = F.metrics_to_floats(sums)
        from verl.utils.fsdp_utils import clip_grad_and_step

        grad_norm, stepped = clip_grad_and_step(self.actor_module, self.actor_optimizer, self.config.get("grad_clip"))
        if not stepped:
            logger.warning("actor grad norm is %s: optimizer step skipped", grad_norm)
        sums["actor/grad_norm"] = grad_norm
        sums["actor/grad_norm_nonfinite"] = 0.0 if stepped else 1.0
        return dict(sums)

    def _micro_batch_loss(self, micro, temperature: float, loss_agg_mode: str) -> tuple[torch.Tensor, dict[str, Any]]:
        response_mask = micro["response_mask"].to(torch.float32)
        entropy_coeff = float(self.config.get("entropy_coeff", 0.0) or 0.0)
        log_prob, entropy = self._forward(micro, temperature, calculate_entropy=True)
        old_log_prob = micro["old_log_probs"] if "old_log_probs" in micro.keys() else log_prob.detach()
        metrics: dict[str, Any] = {}  # floats or 0-d tensors (synced once per mini-batch)
        is_weights = None
        cap = float(self.config.get("tis_imp_ratio_cap", 0) or 0)
        if cap > 0:
            is_weights, is_metrics = core_algos.compute_rollout_is_weights(
                old_log_prob, micro["rollout_log_probs"], response_mask, cap=cap,
                level=self.config.get("tis_level", "token"), mode=self.config.get("tis_mode", "truncate"))
            metrics.update({f"actor/{k}": v for k, v in is_metrics.items()})
        loss_mode = (self.config.get("policy_loss") or {}).get("loss_mode", "vanilla")
        pg_loss, pg_metrics = core_algos.get_policy_loss_fn(loss_mode)(
            old_log_prob, log_prob, micro["advantages"], response_mask, loss_agg_mode, self.config,
            rollout_is_weights=is_weights)
        metrics.update(pg_metrics)
        entropy_loss = core_algos.agg_loss(entropy, response_mask, loss_agg_mode)
        metrics["actor/entropy"] = entropy_loss.detach()
        loss = pg_loss
        if entropy_coeff != 0:
            loss = loss - entropy_coeff * entropy_loss
        if self.config.get("use_kl_loss", False):
            kl = core_algos.kl_penalty(log_prob, micro["ref_log_probs"], self.config.get("kl_loss_type", "low_var_kl"))
            kl_loss = core_algos.agg_loss(kl, response_mask, loss_agg_mode)
            loss = loss + float(self.config.get("kl_loss_coef", 0.001)) * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
            metrics["actor/kl_coef"] = float(self.config.get("kl_loss_coef", 0.001))
        metrics["actor/pg_loss"] = pg_loss.detach()
        return loss, metrics

