"""Build ``example/``: a small real QA sample and its corpus, from ``../shared/data`` (fixed seed).

    python scripts/build_example.py --data_dir /work/shared/data --out_dir example

Writes FlashRAG-style folders ``example/qa/<source>/<split>.jsonl`` (read by
``scripts/data_process/*.py --input_dir example/qa``), ``example/corpus.jsonl`` (``{"id",
"contents"}``) and ``example/README.md`` with the counts. Only those paths are touched.

Choices, and why:
* train = AmbigQA train (NQ-open *train* questions, standing in for NQ train) as ``nq/train`` plus
  HotpotQA train and part of HotpotQA dev as ``hotpotqa/train``; only the latter has linked
  passages (kept in the corpus), so the embedded RL default trains on it alone;
* test = 30 questions of each of Search-R1's seven evaluation sources, preferring questions whose
  answer occurs in their linked passages, so search can help;
* no train question shares its normalised text with any example test question, nor with NQ's
  evaluation sets (NQ-open dev/EfficientQA/AmbigQA dev);
* the corpus keeps, per question, the retrieved wiki-18 passages (``sr1_retrieved_passage_ids``) and
  for HotpotQA the gold paragraphs plus a few distractor paragraphs of its context, then adds random
  distractors; it is capped at ~1,200 passages so a MiniLM index builds in under a minute on 2
  idle cores.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_r1.qa.answers import normalize_answer  # noqa: E402

SEED = 20251129
NUM_TEST = 30
NUM_NQ_TRAIN = 320
NUM_HOTPOT_DEV_TRAIN = 120
HOTPOT_TRAIN_DISTRACTORS = 0   # context paragraphs kept beside the gold ones, per train question
HOTPOT_TEST_DISTRACTORS = 2
NUM_RANDOM_DISTRACTORS = {"wiki18_flashrag_sample": 80, "2wikimultihopqa_paragraphs": 20,
                          "musique_paragraphs": 20}
KEEP_FIELDS = ("id", "question", "golden_answers", "origin", "flashrag_id", "hotpot_id", "type",
               "level", "sr1_retrieved_passage_ids", "context_passage_ids", "gold_passage_ids",
               "answer_in_linked_passages")
# (example source, split) <- shared file; linked = prefer rows whose answer is in linked passages
TEST_SETS = [("nq", "test", "nq/test", True), ("triviaqa", "test", "triviaqa/test", True),
             ("popqa", "test", "popqa/test", True), ("bamboogle", "test", "bamboogle/test", True),
             ("hotpotqa", "dev", "hotpotqa/dev", True),
             ("2wikimultihopqa", "dev", "2wikimultihopqa/dev", False),
             ("musique", "dev", "musique/dev", False)]
NQ_EVAL_FILES = ("nq/test", "nq/efficientqa_dev", "nq/efficientqa_test", "ambigqa/dev")


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def qkey(question: str) -> str:
    """Question identity for leakage checks: SQuAD-normalised text."""
    return normalize_answer(question)


def answer_in(answers: list[str], passages: list[str]) -> bool:
    """A normalised gold answer occurs as whole words in a normalised passage."""
    texts = [f" {normalize_answer(p)} " for p in passages]
    golds = [normalize_answer(a) for a in answers if normalize_answer(a)]
    return any(f" {gold} " in text for gold in golds for text in texts)


class Builder:
    """Holds the shared data and the growing example (questions, corpus ids)."""

    def __init__(self, data_dir: Path, seed: int):
        self.data_dir = data_dir
        self.rng = random.Random(seed)
        self.corpus = {}
        for path in sorted((data_dir / "corpus").glob("*.jsonl")):
            if path.name.endswith(".searches.jsonl"):
                continue
            for row in read_jsonl(path):
                self.corpus[row["id"]] = (path.stem, row["contents"])
        self.kept_ids: set[str] = set()

    def qa(self, name: str) -> list[dict]:
        rows = read_jsonl(self.data_dir / "qa" / f"{name}.jsonl")
        for row in rows:
            row["origin"] = name
        return rows

    def link(self, row: dict, num_distractors: int) -> dict:
        """Keep a row's linked passages (context trimmed to gold + a few), record them."""
        row = dict(row)
        if "context_passage_ids" in row:
            gold = row.get("gold_passage_ids", [])
            others = [pid for pid in row["context_passage_ids"] if pid not in gold]
            keep = set(gold) | set(self.rng.sample(others, min(num_distractors, len(others))))
            row["context_passage_ids"] = [pid for pid in row["context_passage_ids"] if pid in keep]
        linked = row.get("sr1_retrieved_passage_ids", []) + row.get("context_passage_ids", [])
        if linked:
            row["answer_in_linked_passages"] = answer_in(
                row["golden_answers"], [self.corpus[pid][1] for pid in linked])
        self.kept_ids.update(linked)
        return {key: row[key] for key in KEEP_FIELDS if key in row}

    def pick(self, rows: list[dict], count: int, linked: bool, exclude: set[str],
             num_distractors: int = HOTPOT_TEST_DISTRACTORS) -> list[dict]:
        """``count`` random rows, answer-in-linked-passages rows first, none with an excluded key."""
        rows = [r for r in rows if qkey(r["question"]) not in exclude]
        if linked:
            rows = [r for r in rows if r.get("answer_in_linked_passages")]
        chosen, seen = [], set()
        for row in self.rng.sample(rows, len(rows)):
            if qkey(row["question"]) in seen:
                continue
            seen.add(qkey(row["question"]))
            chosen.append(self.link(row, num_distractors))
            if len(chosen) == count:
                break
        if len(chosen) < count:
            raise ValueError(f"only {len(chosen)} usable rows for {rows[0]['origin']}, need {count}")
        return chosen

    def distractors(self) -> None:
        for stem, count in NUM_RANDOM_DISTRACTORS.items():
            pool = sorted(pid for pid, (s, _) in self.corpus.items()
                          if s == stem and pid not in self.kept_ids)
            self.kept_ids.update(self.rng.sample(pool, count))


def build(data_dir: Path, seed: int) -> tuple[dict[str, list[dict]], list[dict]]:
    """Return ({"<source>/<split>": rows}, corpus rows)."""
    builder = Builder(data_dir, seed)
    files: dict[str, list[dict]] = {}
    for source, split, name, linked in TEST_SETS:
        files[f"{source}/{split}"] = builder.pick(builder.qa(name), NUM_TEST, linked, set())
    test_keys = {qkey(r["question"]) for rows in files.values() for r in rows}
    nq_eval_keys = {qkey(r["question"]) for name in NQ_EVAL_FILES for r in builder.qa(name)}

    files["nq/train"] = builder.pick(builder.qa("ambigqa/train"), NUM_NQ_TRAIN, False,
                                     test_keys | nq_eval_keys)
    hotpot_train = builder.qa("hotpotqa/train")
    train_hotpot = builder.pick(hotpot_train, len(hotpot_train), False, test_keys,
                                HOTPOT_TRAIN_DISTRACTORS)
    train_keys = {qkey(r["question"]) for r in train_hotpot}
    train_hotpot += builder.pick(builder.qa("hotpotqa/dev"), NUM_HOTPOT_DEV_TRAIN, True,
                                 test_keys | train_keys, HOTPOT_TRAIN_DISTRACTORS)
    files["hotpotqa/train"] = train_hotpot
    check_no_leak(files)
    builder.distractors()
    corpus = [{"id": pid, "contents": builder.corpus[pid][1], "origin": builder.corpus[pid][0]}
              for pid in sorted(builder.kept_ids)]
    return files, corpus


def check_no_leak(files: dict[str, list[dict]]) -> None:
    """Raise when a train question also appears (normalised) in a test/dev file."""
    train = {qkey(r["question"]) for name, rows in files.items() if name.endswith("/train")
             for r in rows}
    evaluation = {qkey(r["question"]) for name, rows in files.items()
                  if not name.endswith("/train") for r in rows}
    leaked = train & evaluation
    if leaked:
        raise ValueError(f"{len(leaked)} train questions are also test questions: {sorted(leaked)[:3]}")


def write(out_dir: Path, files: dict[str, list[dict]], corpus: list[dict]) -> dict[str, int]:
    counts = {}
    for name, rows in sorted(files.items()):
        path = out_dir / "qa" / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(path, rows)
        counts[f"qa/{name}.jsonl"] = len(rows)
    write_jsonl(out_dir / "corpus.jsonl", [{"id": r["id"], "contents": r["contents"]} for r in corpus])
    counts["corpus.jsonl"] = len(corpus)
    return counts


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


README_HEAD = """# Example data (small, real)

Made by `python scripts/build_example.py` (seed {seed}) from the project's shared data folder
(`/work/shared/data`, see its README for every upstream repository, path and commit). Do not edit by
hand; rerun the builder.

* `qa/<source>/<split>.jsonl`: FlashRAG-style QA rows `{{"id", "question", "golden_answers", ...}}`,
  with `origin` (the shared file a row came from) and, where known, the linked passage ids
  (`sr1_retrieved_passage_ids`, `context_passage_ids`, `gold_passage_ids`) and
  `answer_in_linked_passages` (recomputed on the passages kept here). Read them with
  `scripts/data_process/{{nq_search,qa_search_train_merge,qa_search_test_merge}}.py --input_dir example/qa`.
* `corpus.jsonl`: `{{"id", "contents"}}` with contents `"Title"\\ntext`: every passage linked to
  the questions above (HotpotQA contexts trimmed to the gold paragraphs plus {train_d} (train) /
  {test_d} (test) distractor paragraphs) plus random distractors: {distractors}.

Training set: `nq/train` holds **AmbigQA train** questions (NQ-open *train* questions; NQ train
itself is not available offline), `hotpotqa/train` holds the HotpotQA train questions plus HotpotQA
dev questions. Only `hotpotqa/train` has passages in `corpus.jsonl` (its gold paragraphs); the shared
data links no passage to AmbigQA questions, so search cannot answer `nq/train`, and the embedded
training default (`scripts/quickstart.py --train-sources`, used by `train_*.sh` without a GPU)
trains on `hotpotqa/train` alone; `nq/train` serves the data-processing scripts and the paper's
NQ + HotpotQA mix (`--train-sources nq,hotpotqa`). Test set: {num_test} questions per source for Search-R1's seven evaluation sources
(FlashRAG split names: test, else dev), preferring questions whose answer occurs in their linked
passages (2Wiki and MuSiQue dev have no linked passages). No train question has the normalised text of
an example test question or of an NQ evaluation question (checked by the builder).

## Files

| file | rows | bytes | source (shared data file) |
|---|---|---|---|
"""

README_TAIL = """
## Licenses

As stated by the upstream datasets (not re-checked): Natural Questions / NQ-open CC BY-SA 3.0,
AmbigQA CC BY-SA 3.0, HotpotQA CC BY-SA 4.0, TriviaQA Apache-2.0, PopQA MIT, 2WikiMultihopQA
Apache-2.0, MuSiQue CC BY 4.0, Bamboogle (from FlashRAG/Search-R1 evaluation data; no license file
upstream). The Wikipedia passages (wiki-18 and the HotpotQA/MuSiQue/2Wiki paragraphs) are CC BY-SA.
The GitHub copies used, with commits, are listed in the shared data README.
"""


def write_readme(out_dir: Path, files: dict[str, list[dict]], corpus: list[dict],
                 counts: dict[str, int], seed: int) -> None:
    """README with source, licenses and the row/byte count of every file written."""
    text = README_HEAD.format(
        seed=seed, train_d=HOTPOT_TRAIN_DISTRACTORS, test_d=HOTPOT_TEST_DISTRACTORS,
        num_test=NUM_TEST,
        distractors=", ".join(f"{n} from `{s}`" for s, n in NUM_RANDOM_DISTRACTORS.items()))
    for name, count in counts.items():
        rows = files.get(name[3:-6], [])
        origins = sorted({r["origin"] for r in rows})
        if name == "corpus.jsonl":
            stems = sorted({r["origin"] for r in corpus})
            origins = [f"corpus/{s}.jsonl ({sum(r['origin'] == s for r in corpus)})" for s in stems]
        size = (out_dir / name).stat().st_size
        text += f"| `{name}` | {count} | {size} | {', '.join(origins)} |\n"
    (out_dir / "README.md").write_text(text + README_TAIL, encoding="utf-8")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default="/work/shared/data")
    parser.add_argument("--out_dir", default=str(Path(__file__).resolve().parents[1] / "example"))
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    files, corpus = build(Path(args.data_dir), args.seed)
    counts = write(Path(args.out_dir), files, corpus)
    write_readme(Path(args.out_dir), files, corpus, counts, args.seed)
    for name, count in counts.items():
        print(f"{name}: {count}")


if __name__ == "__main__":
    main()
