"""Batch -> token-level scores: decode each response, score it, put the score on its last token.

The score is the environment's (``Environment.compute_score``). A row whose prompt itself opened an
action (a forced ``<answer>``/``<search>`` prefix; the rollout reports it per row as
``action_prefix``) is scored on ``action_prefix + response``: the action the rollout loop parsed,
so a forced ``<answer>`` followed by the gold answer earns the reward.

The last real response token is found from the attention mask over the response part (or
``response_mask`` when there is no attention mask), never by comparing ids with ``pad_token_id``:
with pad == eos (SmolLM2, Qwen base) a real EOS would otherwise look like padding.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Mapping, Sequence

import numpy as np
import torch



def response_lengths(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Valid length of each response, (B,), from the masks.

    Uses ``attention_mask[:, -R:]`` (real generated and observation tokens), else
    ``response_mask``; the length is the position of the last 1 plus one (0 when none).

    Raises:
        ValueError: the batch has no ``responses`` or neither mask.
    """
    if "responses" not in batch:
        raise ValueError("batch has no 'responses' tensor")
    width = batch["responses"].shape[-1]
    if "attention_mask" in batch:
        mask = batch["attention_mask"][:, -width:]
    elif "response_mask" in batch:
        mask = batch["response_mask"]
    else:
        raise ValueError("batch needs 'attention_mask' or 'response_mask' to find response lengths")
    positions = torch.arange(1, width + 1, device=mask.device).expand_as(mask)
    return (positions * (mask != 0)).max(dim=-1).values


def mean_by_data_source(data_sources: Sequence, scores: Sequence[float]) -> dict[str, float]:
    """``{data_source: mean score}``, e.g. for ``val/test_score/<data_source>`` metrics."""
    grouped: dict[str, list[float]] = defaultdict(list)
    for source, value in zip(data_sources, scores):
        grouped[str(source)].append(float(value))
    return {source: float(np.mean(values)) for source, values in sorted(grouped.items())}


class RewardManager:
    """Scores a generated batch with a rule-based ``compute_score``.

    Args:
        tokenizer: decodes the responses (special tokens such as EOS are skipped).
        compute_score: ``f(data_source, solution_str, ground_truth, extra_info, **kw)`` returning a
            float or a dict with a ``"score"`` key (other keys, e.g. ``em``, go to
            ``reward_extra_info``): the environment's ``compute_score``. For a row with a non-empty
            ``action_prefix`` it also gets ``action_prefix=`` (``solution_str`` then starts with that tag).
        num_examine: responses printed per data source per call (debugging).
        reward_fn_key: the non-tensor field that names the data source.
        **score_kwargs: passed to ``compute_score`` (e.g. ``structure_format_score``).
    """

    def __init__(self, tokenizer, compute_score: Callable, num_examine: int = 0,
                 reward_fn_key: str = "data_source", **score_kwargs):
        if not callable(compute_score):
            raise TypeError(f"compute_score must be callable, got {compute_score!r}; the signature "
                            "is RewardManager(tokenizer, compute_score, num_examine=0, ...)")
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.num_examine = int(num_examine)
        self.reward_fn_key = reward_fn_key
        self.score_kwargs = score_kwargs
        self.last_data_source_means: dict[str, float] = {}

    def __call__(self, data, return_dict: bool = False):
        """Token-level scores of a DataProto (or anything with ``.batch``/``.non_tensor_batch``).

        Returns:
            ``token_level_scores`` (B, R) float32, zero except at each response's last real token;
            with ``return_dict`` ``{"reward_tensor": ..., "reward_extra_info": {key: [B values]}}``.
        Raises:
            ValueError: a row lacks ``reward_model.ground_truth`` (names the row).
        """
        responses = data.batch["responses"]
        lengths = response_lengths(data.batch)
        reward_tensor = torch.zeros(responses.shape, dtype=torch.float32)
        extra: dict[str, list] = defaultdict(list)
        sources, printed = [], defaultdict(int)
        texts = self.tokenizer.batch_decode([ids[:length] for ids, length in zip(responses.tolist(), lengths.tolist())],
                                            skip_special_tokens=True)
        for row in range(responses.shape[0]):
            length = int(lengths[row])
            prefix = self._action_prefix(data.non_tensor_batch, row)
            text = prefix + texts[row]
            source, ground_truth, extra_info = self._row_fields(data.non_tensor_batch, row)
            row_kwargs = {"action_prefix": prefix} if prefix else {}
            result = self.compute_score(data_source=source, solution_str=text,
                                        ground_truth=ground_truth, extra_info=extra_info,
                                        **self.score_kwargs, **row_kwargs)
            score = self._collect(result, extra)
            if length > 0:
                reward_tensor[row, length - 1] = score
            sources.append(source)
            if printed[source] < self.num_examine:
                printed[source] += 1
                print(f"[{source}] score={score} ground_truth={ground_truth}\n{text}", flush=True)
        for key in [key for key, values in extra.items() if len(values) != len(sources)]:
            del extra[key]  # a column not every row reported (mixed sources) is no per-row column
        self.last_data_source_means = mean_by_data_source(sources, extra["score"])
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": dict(extra)}
        return reward_tensor

    @staticmethod
    def _action_prefix(non_tensor: Mapping[str, np.ndarray], row: int) -> str:
        """The action tag the row's prompt opened ("" for rows without one, or without the field)."""
        if "action_prefix" not in non_tensor:
            return ""
        return str(non_tensor["action_prefix"][row] or "")

    def _row_fields(self, non_tensor: Mapping[str, np.ndarray], row: int):
        if self.reward_fn_key not in non_tensor:
            raise ValueError(f"batch has no {self.reward_fn_key!r} field")
        reward_model = non_tensor["reward_model"][row] if "reward_model" in non_tensor else None
        if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
            raise ValueError(f"row {row}: reward_model {reward_model!r:.100} has no 'ground_truth'")
        extra_info = non_tensor["extra_info"][row] if "extra_info" in non_tensor else None
        return str(non_tensor[self.reward_fn_key][row]), reward_model["ground_truth"], extra_info

    @staticmethod
    def _collect(result, extra: dict[str, list]) -> float:
        """The row's score; dict results add their other keys to ``extra``."""
        if isinstance(result, Mapping):
            for key, value in result.items():
                if key != "score":
                    extra[key].append(value)
            result = result["score"]
        extra["score"].append(float(result))
        return float(result)
