"""Per-rank batch sizes, derived from the global configuration by pure functions.

veRL's convention: algorithmic sizes are global (``ppo_mini_batch_size``, counted in prompts, x
``rollout.n`` rows) and performance knobs are per rank (``*_micro_batch_size_per_gpu``, token
budgets). Search-R1's global ``*_micro_batch_size`` is split over the ranks when the per-rank key is
unset. The workers call these with their world size; the trainer calls them at start with the
data-parallel size, so a size that does not split fails before any model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

_SHUFFLE_SEED = 0  # ``shuffle``: a fixed permutation of the rows per epoch


@dataclass(frozen=True)
class MicroBatching:
    """How one rank splits its rows into forward (and backward) micro-batches.

    ``rows``: rows per micro-batch (None with ``use_dynamic_bsz``); ``max_token_len``: token budget
    per micro-batch when ``use_dynamic_bsz``.
    """

    rows: int | None
    use_dynamic_bsz: bool
    max_token_len: int


@dataclass(frozen=True)
class UpdateBatching:
    """An optimizer step's rows on one rank (``mini_batch_rows``) and their micro-batches."""

    mini_batch_rows: int
    micro: MicroBatching


def split_over_ranks(value: int, world_size: int, key: str) -> int:
    """``value // world_size`` for a global size that must split evenly over the ranks.

    Raises:
        ValueError: ``value`` is not a positive multiple of ``world_size``, naming ``key`` and both numbers.
    """
    if value < world_size or value % world_size:
        raise ValueError(f"{key} ({value}) is not divisible by data-parallel size (nnodes x n_gpus_per_node) "
                         f"({world_size})")
    return value // world_size


def micro_batching(key: str, global_rows: int | None, rows_per_gpu: int | None, use_dynamic_bsz: bool,
                   max_token_len: int, world_size: int, fallback_rows: int | None = None) -> MicroBatching:
    """Rows per micro-batch on one rank: ``<key>_per_gpu``, else ``<key>`` split over the ranks,
    else ``fallback_rows``; None (token budget only) with dynamic batch size.

    Raises:
        ValueError: nothing sets the rows and dynamic batch size is off, or the global size does
            not split over the ranks.
    """
    rows = rows_per_gpu
    if rows is None and global_rows:
        rows = split_over_ranks(int(global_rows), world_size, key)
    if rows is None:
        rows = fallback_rows
    if rows is None and not use_dynamic_bsz:
        raise ValueError(f"set {key}_per_gpu or {key} (or use_dynamic_bsz with a token budget)")
    return MicroBatching(rows=None if rows is None else int(rows), use_dynamic_bsz=bool(use_dynamic_bsz),
                         max_token_len=int(max_token_len))


def update_batching(prefix: str, mini_batch_size: int, rollout_n: int, micro: MicroBatching,
                    world_size: int) -> UpdateBatching:
    """The rows of one optimizer step on each rank: ``mini_batch_size x rollout_n / world_size``.

    Raises:
        ValueError: the rows do not split over the ranks, or (without dynamic batch size) a rank's
            rows do not split into whole micro-batches.
    """
    rows = split_over_ranks(int(mini_batch_size) * int(rollout_n), world_size,
                            f"{prefix}.ppo_mini_batch_size x rollout.n rows ({mini_batch_size} x {rollout_n})")
    if not micro.use_dynamic_bsz and rows % int(micro.rows):
        raise ValueError(f"{prefix}.ppo_mini_batch_size x rollout.n rows per rank ({rows}) is not divisible by "
                         f"{prefix}.ppo_micro_batch_size per rank ({micro.rows})")
    return UpdateBatching(mini_batch_rows=rows, micro=micro)


def actor_update_batching(actor, rollout_n: int, world_size: int) -> UpdateBatching:
    """Per-rank rows of the actor's update (``actor``: an ``ActorConfig``)."""
    micro = micro_batching("actor.ppo_micro_batch_size", actor.ppo_micro_batch_size,
                           actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz,
                           actor.ppo_max_token_len_per_gpu, world_size)
    return update_batching("actor", actor.ppo_mini_batch_size, rollout_n, micro, world_size)


def log_prob_batching(prefix: str, node, actor, world_size: int) -> MicroBatching:
    """Per-rank micro-batches of a log-prob pass (``node``: the ``rollout`` or ``ref`` config;
    its unset dynamic-batching keys follow ``actor``, the ``ActorConfig``)."""
    use_dynamic = actor.use_dynamic_bsz if node.log_prob_use_dynamic_bsz is None else node.log_prob_use_dynamic_bsz
    max_tokens = node.log_prob_max_token_len_per_gpu or actor.ppo_max_token_len_per_gpu
    return micro_batching(f"{prefix}.log_prob_micro_batch_size", node.log_prob_micro_batch_size,
                          node.log_prob_micro_batch_size_per_gpu, use_dynamic, max_tokens, world_size)


def critic_batching(critic, rollout_n: int, world_size: int) -> tuple[UpdateBatching, MicroBatching]:
    """Per-rank rows of the critic's update and of its value forward (``critic``: a ``CriticConfig``)."""
    micro = micro_batching("critic.ppo_micro_batch_size", critic.ppo_micro_batch_size,
                           critic.ppo_micro_batch_size_per_gpu, critic.use_dynamic_bsz,
                           critic.ppo_max_token_len_per_gpu, world_size)
    update = update_batching("critic", critic.ppo_mini_batch_size, rollout_n, micro, world_size)
    forward = micro_batching("critic.forward_micro_batch_size", critic.forward_micro_batch_size,
                             critic.forward_micro_batch_size_per_gpu, critic.use_dynamic_bsz,
                             critic.forward_max_token_len_per_gpu, world_size, fallback_rows=micro.rows)
    return update, forward


def micro_batches(batch, micro: MicroBatching):
    """``(micro-batches, partitions)`` of a rank's TensorDict under ``micro`` (rows or a token
    budget); ``partitions`` restores the original row order (``seqlen_balancing.restore_order``)."""
    from verl.utils.seqlen_balancing import split_micro_batches

    return split_micro_batches(batch, micro_batch_size=micro.rows,
                               max_token_len=micro.max_token_len if micro.use_dynamic_bsz else None)


def mini_batches(batch, update: UpdateBatching, epochs: int, shuffle: bool) -> Iterator:
    """The mini-batches of ``epochs`` PPO passes over a rank's TensorDict, rows permuted per epoch
    when ``shuffle``."""
    for epoch in range(epochs):
        rows = batch
        if shuffle:
            generator = torch.Generator().manual_seed(_SHUFFLE_SEED + epoch)
            rows = batch[torch.randperm(batch.batch_size[0], generator=generator)]
        for start in range(0, rows.batch_size[0], update.mini_batch_rows):
            yield rows[start:start + update.mini_batch_rows]
