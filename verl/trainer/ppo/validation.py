"""Validation: greedy multi-turn rollouts over the whole validation set, scored per data source.

Reports ``val/test_score/<data_source>`` (the reward), ``val/test_em/<data_source>`` (exact match,
when the reward manager reports it) and the search statistics (``val/env/*``); optionally
writes one JSON line per sample (prompt, response, score, ground truth, turns) to
``<validation_data_dir>/<global_step>.jsonl`` for inspection.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from verl.trainer.ppo.metric_utils import compute_env_metrics, compute_validation_metrics, row_stat


def run_validation(batches: Iterable, generate: Callable, reward_fn: Callable, tokenizer,
                   dump_dir: str | None = None, global_step: int = 0) -> dict[str, float]:
    """Generate, score and summarise every validation batch.

    Args:
        batches: DataProto prompt batches (file order).
        generate: prompt batch -> generated batch (the trainer's greedy multi-turn rollout).
        reward_fn: the validation reward manager (``return_dict=True`` call).
        dump_dir: folder for ``<global_step>.jsonl``; None to skip.
    """
    sources, scores, ems, env, records = [], [], [], [], []
    for batch in batches:
        generated = generate(batch)
        result = reward_fn(generated, return_dict=True)
        row_scores = result["reward_tensor"].sum(-1).tolist()
        ems += list(result.get("reward_extra_info", {}).get("em", []))
        row_sources = [str(s) for s in generated.non_tensor_batch.get("data_source", ["unknown"] * len(generated))]
        sources += row_sources
        scores += row_scores
        env.append(compute_env_metrics(generated))
        if dump_dir:
            records += _records(generated, row_scores, row_sources, tokenizer)
    if dump_dir:
        _dump(records, Path(dump_dir) / f"{global_step}.jsonl")
    metrics = compute_validation_metrics(sources, scores, env)
    if ems and len(ems) == len(scores):  # shaped rewards: report the exact match on its own too
        metrics.update({key.replace("test_score", "test_em"): value for key, value in
                        compute_validation_metrics(sources, ems, []).items()})
    return metrics


def _records(batch, scores: list[float], sources: list[str], tokenizer) -> list[dict]:
    tensors, fields = batch.batch, batch.non_tensor_batch
    width = tensors["responses"].shape[-1]
    attention = tensors["attention_mask"]
    records = []
    for row in range(len(batch)):
        prompt_ids = tensors["prompts"][row][attention[row, :-width].bool()]
        response_ids = tensors["responses"][row][attention[row, -width:].bool()]
        record = {"data_source": sources[row], "score": scores[row],
                  "input": tokenizer.decode(prompt_ids.tolist()),
                  "output": tokenizer.decode(response_ids.tolist())}
        if "reward_model" in fields:
            record["ground_truth"] = _jsonable(fields["reward_model"][row].get("ground_truth"))
        for key in ("turns", "valid_search", "finished"):
            values = row_stat(batch, key)
            if values is not None:
                record[key] = int(values[row])
        records.append(record)
    return records


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _dump(records: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
