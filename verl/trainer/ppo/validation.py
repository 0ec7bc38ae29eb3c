"""Validation: greedy multi-turn rollouts over the whole validation set, scored per data source.

One record per question (the row's data source, uid, question, gold answers, prompt, full
trajectory, extracted answer, EM, F1, cover-EM, reward, turns, searches, token counts) is collected
batch after batch; every ``val/*`` figure is then a statistic over those records, so uneven batches
(101 rows as 50 + 50 + 1) weigh each question once. Reports ``val/test_score/<data_source>`` (the
reward), ``val/test_em/<data_source>``, ``val/test_f1/*``, ``val/test_cover_em/*`` and
``val/test_retrieved/*`` (the answer matches and whether a search found a gold answer, when the
reward manager reports them) and the search statistics ``val/env/*``; optionally
writes the records as ``<validation_data_dir>/<global_step>.jsonl``, the per-question file that ``evaluate.sh`` (``verl.trainer.main_eval``) summarises, and a report of
them beside it (the environment's trajectory report, ``<global_step>.html``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from tqdm import tqdm

from verl.trainer.ppo.metric_utils import compute_validation_metrics, row_stats, stat_keys


def run_validation(batches: Iterable, generate: Callable, reward_fn: Callable, tokenizer, env,
                   dump_dir: str | None = None, global_step: int = 0, progress: bool = True,
                   report: Callable[[list[dict], Path], object] | None = None) -> dict[str, float]:
    """Generate, score and summarise every validation batch.

    Args:
        batches: DataProto prompt batches (file order); a ``num_rows`` attribute sizes the progress bar.
        generate: ``generate(batch, on_turn=callback)`` -> generated batch (the trainer's greedy
            multi-turn rollout; ``callback`` takes the rollout's per-turn progress).
        reward_fn: the validation reward manager (``return_dict=True`` call).
        env: the run's environment (reads answers and questions, adds its own figures).
        dump_dir: folder for ``<global_step>.jsonl`` (one record per question); None to skip.
        progress: show a progress bar over questions: questions done, the batch's turn and rows
            still generating, and the time left at that pace (updated after every turn).
        report: called as ``report(records, <dump_dir>/<global_step>.html)`` after the dump is
            written (with ``dump_dir`` only).
    Returns:
        ``val/*`` metrics, each a per-question statistic (:func:`validation_metrics`).
    """
    records = collect_records(batches, generate, reward_fn, tokenizer, env, progress)
    if dump_dir:
        write_records(records, Path(dump_dir) / f"{global_step}.jsonl")
        if report is not None:
            report(records, Path(dump_dir) / f"{global_step}.html")
    return validation_metrics(records, env)


def collect_records(batches: Iterable, generate: Callable, reward_fn: Callable, tokenizer, env,
                    progress: bool = True) -> list[dict]:
    """One record per validation row, in input order (see :func:`batch_records`)."""
    records: list[dict] = []
    with tqdm(total=getattr(batches, "num_rows", None), desc="validation", unit="question",
              disable=not progress, dynamic_ncols=True) as bar:
        for number, batch in enumerate(batches, 1):
            shown = TurnBar(bar, number)
            generated = generate(batch, on_turn=shown)
            records += batch_records(generated, reward_fn(generated, return_dict=True), tokenizer, env)
            shown.finish(len(generated))
    return records


class TurnBar:
    """Moves a questions bar along a batch's turns: rows that ended count as done at once.

    Args:
        bar: the ``tqdm`` bar over questions.
        batch_number: shown with the turn (``batch 2, turn 3/4: 57 rows generating``).
    """

    def __init__(self, bar, batch_number: int) -> None:
        self.bar, self.batch_number, self.done = bar, batch_number, 0

    def __call__(self, progress) -> None:
        """Take a :class:`verl.workers.rollout.agent_loop.TurnProgress`."""
        self.bar.set_postfix_str(f"batch {self.batch_number}, turn {progress.turn}/{progress.max_turns}: "
                                 f"{progress.active} rows generating", refresh=False)
        self.bar.update(progress.rows - progress.active - self.done)
        self.bar.refresh()  # every turn, however soon after the last one (tqdm skips updates within 0.1 s)
        self.done = progress.rows - progress.active

    def finish(self, rows: int) -> None:
        """The batch is scored: all its ``rows`` are done."""
        self.bar.update(rows - self.done)
        self.done = rows


# Per-row answer matches the environment's reward may report, each a val/test_<name>/* figure.
MATCH_KEYS = ("em", "f1", "cover_em", "retrieved")


def validation_metrics(records: list[dict], env=None) -> dict[str, float]:
    """``val/*`` metrics of a list of records: means over questions, per source and over all."""
    sources = [r["data_source"] for r in records]
    matches = {key: [r[key] for r in records] for key in MATCH_KEYS if records and all(key in r for r in records)}
    stats = {key: np.array([r[key] for r in records], dtype=float) if all(key in r for r in records) else None
             for key in stat_keys(env)}
    return compute_validation_metrics(sources, [r["score"] for r in records], stats, matches, env)


def batch_records(batch, result: dict, tokenizer, env) -> list[dict]:
    """Per-row records of a generated, scored batch.

    Args:
        batch: the rollout's output (``prompts`` (B, P), ``responses`` (B, R),
            ``attention_mask`` (B, P + R), ``response_mask`` (B, R), per-row stats) with the prompt
            rows' non-tensor fields.
        result: the reward manager's ``{"reward_tensor": (B, R), "reward_extra_info": {...}}``.
        env: the environment (``question_of``, ``extract_answer``, ``counters``).
    Returns:
        dicts with ``data_source, uid`` (the dataset's row id), ``question, gold, ground_truth, input, output`` (the decoded
        trajectory: generated and retrieved text, special tokens skipped as the reward sees it),
        ``answer`` (the environment's reading of the output, or None), ``score``, each per-row
        number the reward reported beside it (``reward_extra_info``: ``em``, ``f1``, ``cover_em``
        for the QA rewards), the loop's and the environment's per-row stats, ``response_tokens`` (model-generated tokens) and ``response_length``
        (all response tokens, observations included).
    """
    tensors, fields = batch.batch, batch.non_tensor_batch
    width = tensors["responses"].shape[-1]
    attention = tensors["attention_mask"].bool()
    scores = result["reward_tensor"].sum(-1).tolist()
    extras = row_numbers(result.get("reward_extra_info", {}), len(batch))
    stats = row_stats(batch, env)
    generated_tokens = tensors["response_mask"].sum(-1).tolist()
    records = []
    for row in range(len(batch)):
        prompt = tokenizer.decode(tensors["prompts"][row][attention[row, :-width]].tolist())
        response_ids = tensors["responses"][row][attention[row, -width:]].tolist()
        output = tokenizer.decode(response_ids, skip_special_tokens=True)
        ground_truth = _jsonable(fields["reward_model"][row].get("ground_truth")) if "reward_model" in fields else None
        record = {"data_source": str(fields["data_source"][row]) if "data_source" in fields else "unknown",
                  "uid": _row_id(fields, row),
                  "question": env.question_of(prompt), "gold": _answers(ground_truth), "ground_truth": ground_truth,
                  "input": prompt, "output": output, "answer": env.extract_answer(output), "score": float(scores[row])}
        record.update({key: values[row] for key, values in extras.items() if key not in record})
        record.update({key: int(values[row]) for key, values in stats.items() if values is not None})
        record["response_tokens"] = int(generated_tokens[row])
        record["response_length"] = len(response_ids)
        records.append(record)
    return records


def row_numbers(extra_info: dict, num_rows: int) -> dict[str, list[float]]:
    """The reward's per-row extras that are numbers, one per row (``score`` left out: the record's
    own comes from the reward tensor)."""
    out = {}
    for key, values in extra_info.items():
        if key == "score" or len(values) != num_rows:
            continue
        if all(isinstance(v, (int, float, np.integer, np.floating)) for v in values):
            out[key] = [float(v) for v in values]
    return out


def _row_id(fields: dict, row: int) -> str:
    """The dataset's id of a row: ``extra_info.uid`` (the data scripts write one), else
    ``<data_source>-<index>``; the batch's ``uid`` column is a per-rollout group id, not this."""
    extra = fields["extra_info"][row] if "extra_info" in fields else None
    if isinstance(extra, dict) and extra.get("uid") is not None:
        return str(extra["uid"])
    index = fields["index"][row] if "index" in fields else row
    return f"{fields['data_source'][row]}-{index}" if "data_source" in fields else str(index)


def _answers(ground_truth) -> list[str]:
    if isinstance(ground_truth, dict):
        ground_truth = ground_truth.get("target", [])
    if isinstance(ground_truth, str):
        return [ground_truth]
    return [str(a) for a in ground_truth] if isinstance(ground_truth, list) else []


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_records(records: list[dict], path: Path) -> None:
    """One JSON line per record (UTF-8, non-ASCII kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_records(path: str | Path) -> list[dict]:
    """The records of a file written by :func:`write_records`."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
