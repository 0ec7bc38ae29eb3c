"""Data of the GPU learning run (issue 19 part 2): training questions the shared corpus answers, and a
fixed validation set of other questions over all seven sources, never trained on.

    python benchmarks/learning_data.py [--shared ../shared/data] [--out data/learning] [--seed 19]

Training pool: the questions of ``../shared/data/qa`` whose linked passages are in the shared corpus
and hold a gold answer (``answer_in_linked_passages``): NQ, TriviaQA and PopQA test, HotpotQA dev and
train, MuSiQue train. Validation (``VAL_COUNTS``, 1,000 questions): for NQ, TriviaQA, PopQA and
HotpotQA a seeded sample of that same pool (held out of training); for 2Wiki and MuSiQue dev, whose
questions the corpus links none of, a seeded sample of the whole file; Bamboogle whole (100). No
training question has the normalised text (SQuAD normalisation) of a validation question, and no
question is trained on twice. Validation also leaves out every question of ``example/qa/*/train*.jsonl``,
where the SFT warm start (``scripts/make_sft_data.py``) takes its demonstrations.

Writes, under ``--out``: ``qa/<source>/{train,test}.jsonl`` (FlashRAG rows), then ``train.parquet`` and
``test.parquet`` through ``scripts/data_process/qa_search_{train,test}_merge.py``; ``corpus.jsonl``
(every shared corpus file, concatenated: ids are unique across them); ``selection.json`` (counts per
source and split, the seed, the rules). Deterministic for a given seed and shared data.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from search_r1.qa.answers import normalize_answer  # noqa: E402

SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
# source -> (QA files whose answerable questions may be trained on, file validation draws from, linked only)
POOLS = {
    "nq": (["nq/test.jsonl"], "nq/test.jsonl", True),
    "triviaqa": (["triviaqa/test.jsonl"], "triviaqa/test.jsonl", True),
    "popqa": (["popqa/test.jsonl"], "popqa/test.jsonl", True),
    "hotpotqa": (["hotpotqa/dev.jsonl", "hotpotqa/train.jsonl"], "hotpotqa/dev.jsonl", True),
    "2wikimultihopqa": ([], "2wikimultihopqa/dev.jsonl", False),
    "musique": (["musique/train.jsonl"], "musique/dev.jsonl", False),
    "bamboogle": ([], "bamboogle/test.jsonl", False),
}
VAL_COUNTS = {"nq": 125, "triviaqa": 125, "popqa": 100, "hotpotqa": 150, "2wikimultihopqa": 200,
              "musique": 200, "bamboogle": 100}
CORPUS_SUFFIX = ".jsonl"
NOT_CORPUS = (".searches.jsonl",)  # the retrieval log beside the passages


def question_key(question: str) -> str:
    """Two questions are the same when their SQuAD-normalised texts are equal."""
    return normalize_answer(question)


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _qa_row(row: dict) -> dict:
    return {"id": str(row["id"]), "question": row["question"], "golden_answers": list(row["golden_answers"])}


def warm_start_questions(example_qa: Path = ROOT / "example" / "qa") -> set[str]:
    """Normalised questions the SFT warm start may have seen (its demonstrations' source files)."""
    return {question_key(r["question"]) for path in sorted(example_qa.glob("*/train*.jsonl")) for r in read_jsonl(path)}


def select(qa_dir: Path, seed: int, val_counts: dict[str, int] = VAL_COUNTS,
           exclude: frozenset[str] = frozenset()) -> dict[str, dict[str, list[dict]]]:
    """``{source: {"train": rows, "test": rows}}``; validation first (never a question of ``exclude``),
    then training without the validation questions.

    Raises:
        ValueError: a source has fewer candidates than its validation count.
    """
    rng = random.Random(seed)
    val: dict[str, list[dict]] = {}
    for source in SOURCES:
        _, val_file, linked_only = POOLS[source]
        rows = [r for r in read_jsonl(qa_dir / val_file) if (not linked_only or r.get("answer_in_linked_passages"))
                and question_key(r["question"]) not in exclude]
        rows = _unique(sorted(rows, key=lambda r: str(r["id"])))
        if len(rows) < val_counts[source]:
            raise ValueError(f"{val_file}: {len(rows)} candidates for {val_counts[source]} validation questions")
        rng.shuffle(rows)
        val[source] = rows[:val_counts[source]]
    held_out = {question_key(r["question"]) for rows in val.values() for r in rows}
    selection = {}
    for source in SOURCES:
        train = []
        for file in POOLS[source][0]:
            train += [r for r in read_jsonl(qa_dir / file) if r.get("answer_in_linked_passages")]
        train = [r for r in _unique(sorted(train, key=lambda r: str(r["id"]))) if question_key(r["question"]) not in held_out]
        held_out |= {question_key(r["question"]) for r in train}  # a question is trained on once, in one source
        selection[source] = {"train": [_qa_row(r) for r in train], "test": [_qa_row(r) for r in val[source]]}
    return selection


def _unique(rows: list[dict]) -> list[dict]:
    seen, out = set(), []
    for row in rows:
        key = question_key(row["question"])
        if key and key not in seen:
            seen.add(key)
            out.append(row)
    return out


def write_qa(selection: dict, qa_out: Path) -> None:
    for source, splits in selection.items():
        for split, rows in splits.items():
            if rows:
                path = qa_out / source / f"{split}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def write_corpus(corpus_dir: Path, out: Path) -> dict[str, int]:
    """Concatenate the shared corpus files; returns passages per file."""
    counts = {}
    with open(out, "w", encoding="utf-8") as target:
        for path in sorted(corpus_dir.iterdir()):
            if path.name.endswith(CORPUS_SUFFIX) and not path.name.endswith(NOT_CORPUS):
                text = path.read_text(encoding="utf-8")
                counts[path.name] = sum(1 for line in text.splitlines() if line.strip())
                target.write(text if text.endswith("\n") else text + "\n")
    return counts


def build(shared: Path, out: Path, seed: int) -> dict:
    """Everything in the module docstring; returns the ``selection.json`` content."""
    warm_start = frozenset(warm_start_questions())
    selection = select(shared / "qa", seed, exclude=warm_start)
    write_qa(selection, out / "qa")
    train_sources = ",".join(s for s in SOURCES if selection[s]["train"])
    script = ROOT / "scripts" / "data_process"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name, sources in (("qa_search_train_merge.py", train_sources), ("qa_search_test_merge.py", ",".join(SOURCES))):
        subprocess.run([sys.executable, str(script / name), "--local_dir", str(out), "--input_dir", str(out / "qa"),
                        "--data_sources", sources, "--strict"], check=True, env=env, capture_output=True)
    corpus = write_corpus(shared / "corpus", out / "corpus.jsonl")
    summary = {"seed": seed, "shared": str(shared), "corpus_passages": corpus,
               "excluded_from_validation": {"warm_start_questions": len(warm_start)},
               "counts": {s: {split: len(rows) for split, rows in selection[s].items()} for s in SOURCES},
               "rules": __doc__.split("\n\n")[2]}
    summary["totals"] = {split: sum(c[split] for c in summary["counts"].values()) for split in ("train", "test")}
    (out / "selection.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=os.environ.get("SEARCH_R1_SHARED_DATA", str(ROOT.parent / "shared" / "data")))
    parser.add_argument("--out", default=str(ROOT / "data" / "learning"))
    parser.add_argument("--seed", type=int, default=19)
    args = parser.parse_args(argv)
    shared = Path(args.shared)
    if not (shared / "qa").is_dir() or not (shared / "corpus").is_dir():
        raise SystemExit(f"error: no qa/ and corpus/ under {shared} (set --shared or SEARCH_R1_SHARED_DATA)")
    summary = build(shared, Path(args.out), args.seed)
    print(json.dumps({"counts": summary["counts"], "totals": summary["totals"]}, indent=1))


if __name__ == "__main__":
    main()
