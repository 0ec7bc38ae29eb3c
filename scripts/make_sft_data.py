"""Search-then-answer SFT demonstrations for the format warm start (issue 8).

Each demonstration is one chat: the RL stage's user prompt (``search_r1.envs.search_r1.prompts.make_prefix``) and an
assistant turn in the exact form the generation manager produces::

    <think> ... </think>\\n<search> QUERY </search>            <- generated, stops at </search>
    \\n\\n<information>Doc 1(Title: ...) ...</information>\\n\\n   <- observation (format_observation)
    <think> ... </think>\\n<answer> GOLD </answer>              <- generated

The passages come from the project's retriever over ``example/corpus.jsonl`` (in-process BM25 by
default, or a running server via ``--retriever_url``), the answer is the shortest gold answer, and
the reasoning is short and templated. Questions come from **training** files only; any question
whose normalised text appears in a test/dev file under ``--qa_dir`` (or ``--exclude_dir``) is
refused, so the warm start never sees an evaluation question. Demonstrations whose retrieved
passages contain the answer are preferred (the model learns to copy from ``<information>``).

``--multi_hop_searches 2`` demonstrates multi-hop questions (``MULTI_HOP_SOURCES``) with two searches::

    <think> FIRST </think>\\n<search> QUESTION </search> + observation
    <think> MIDDLE: found X, still missing Y </think>\\n<search> Y </search> + observation
    <think> FINAL </think>\\n<answer> GOLD </answer>

where Y, the bridge entity, is the title of the row's gold passage (``gold_passage_ids``, looked up
by id in ``--corpus``) that the first search ranked lowest; the question is appended to Y when the
title alone does not retrieve that passage. Single-hop questions keep one search. The mix is
``--multi_hop_fraction`` (default 0.5: half two-search multi-hop demos, half one-search single-hop
demos), so the model learns to choose its search count from the question rather than to always
search twice (RL from a one-search warm start stays at exactly 1.00 searches per question on every
source, docs/sft.md). Multi-hop rows without two gold passages in the corpus are not used. Among
multi-hop rows, those whose second observation contains the answer and whose first does not (the
second search was needed) come first. The default (1) is the one-search recipe, byte for byte.

    python scripts/make_sft_data.py --qa_dir example/qa --corpus example/corpus.jsonl \\
        --output_dir ~/data/search_r1_sft --num_demos 300
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from search_r1.envs.search_r1.prompts import format_observation, make_prefix  # noqa: E402
from search_r1.search.passages import format_passages, split_contents  # noqa: E402

# Data sources whose questions need two facts (HotpotQA, 2Wiki, MuSiQue, Bamboogle); the rest are single-hop.
MULTI_HOP_SOURCES = frozenset({"hotpotqa", "2wikimultihopqa", "musique", "bamboogle"})

FIRST_THOUGHTS = [
    "I need more information to answer this. Let me search for it.",
    "I am not sure of the answer, so I will search first.",
    "To answer this I should look it up.",
]
# The second think must read clearly unlike the first (a model shown one kind of think repeats it and
# searches again; docs/sft.md) and state the answer it found, so copying from <information> is what
# gets imitated.
FINAL_THOUGHTS = [
    "The passages say {answer}, so the answer is {answer}.",
    "I found it: the documents show the answer is {answer}.",
    "The information answers the question: {answer}.",
]
# The think between two searches (``--multi_hop_searches 2``) names what the first search found (the
# top passage's title) and what is still missing (the second query's entity), so the second query is
# copied from the question or the first <information>. It reads unlike the first think (which asks for
# any search: repeating it is v1's loop) and the final one (which states the answer).
MIDDLE_THOUGHTS = [
    "The passages tell me about {found}, but not yet the answer. I still need to look up {missing}.",
    "I found {found}; what is still missing is {missing}, so I will search for that next.",
    "{found} is only part of it. To finish I need information on {missing}.",
]


def normalize_text(text: str) -> str:
    """SQuAD-style normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def is_train_file(path: Path) -> bool:
    return path.stem.startswith("train")


def held_out_questions(qa_dirs: list[Path]) -> set[str]:
    """Normalised question texts of every non-train (test/dev/...) file under ``qa_dirs``."""
    held_out = set()
    for qa_dir in qa_dirs:
        for path in sorted(qa_dir.rglob("*.jsonl")):
            if not is_train_file(path):
                held_out.update(normalize_text(row["question"]) for row in read_jsonl(path))
    return held_out


def training_questions(qa_dir: Path, held_out: set[str]) -> list[dict]:
    """Rows of ``qa_dir/<source>/train*.jsonl`` whose question is not held out (deduplicated)."""
    rows, seen = [], set()
    for path in sorted(qa_dir.rglob("*.jsonl")):
        if not is_train_file(path):
            continue
        for row in read_jsonl(path):
            key = normalize_text(row["question"])
            if key in held_out or key in seen or not row.get("golden_answers"):
                continue
            seen.add(key)
            rows.append(dict(row, data_source=path.parent.name))
    return rows


class InProcessBM25:
    """The project's BM25 retriever over a corpus file, with the client's ``retrieve`` signature."""

    def __init__(self, corpus_path: str, topk: int):
        from search_r1.search.bm25 import BM25Retriever
        from search_r1.search.corpus import load_corpus

        self.retriever = BM25Retriever.build(load_corpus(corpus_path))
        self.topk = topk

    def retrieve(self, queries: list[str]) -> list[list[dict]]:
        return self.retriever.search(queries, self.topk)


def make_retriever(corpus: str, topk: int, url: str | None):
    """A ``RetrieverClient`` for ``url`` when given, else in-process BM25 over ``corpus``."""
    if url:
        from search_r1.search.client import RetrieverClient

        return RetrieverClient(url, topk=topk)
    return InProcessBM25(corpus, topk)


def search_query(question: str) -> str:
    return question.strip().rstrip("?").strip()


def contains_answer(row: dict, text: str) -> bool:
    """Whether a gold answer of ``row`` appears, as whole normalised words, in ``text``."""
    return any(f" {normalize_text(a)} " in f" {normalize_text(text)} " for a in row["golden_answers"])


def passage_title(item: dict) -> str:
    """The title of a retrieved item or a ``{"contents"}`` document, without wiki-18's quotes."""
    return split_contents(item.get("document", item)["contents"])[0].strip('"')


def load_passages(corpus_path: str, ids: set[str]) -> dict[str, dict]:
    """The documents ``{"id", "contents"}`` among ``ids`` that the corpus holds, by id (no search)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from search_r1.search.corpus import load_corpus

    corpus = load_corpus(corpus_path)
    wanted = pc.is_in(corpus.ids, value_set=pa.array(sorted(ids), pa.string()))
    return {doc["id"]: doc for doc in corpus.take(np.flatnonzero(wanted.to_numpy(zero_copy_only=False)))}


def gold_ids(row: dict, passages: dict[str, dict]) -> list[str]:
    """The row's gold passage ids (``gold_passage_ids``, HotpotQA rows) that ``passages`` holds."""
    return [pid for pid in row.get("gold_passage_ids") or [] if pid in passages]


@dataclass(frozen=True)
class Search:
    """A search after the first one: its query, what it retrieved, and the entity it looks for
    (named as missing in the think before it)."""

    query: str
    docs: list[dict]
    entity: str


def second_searches(rows: list[dict], first_results: list[list[dict]], passages: dict[str, dict],
                    retriever) -> list[Search]:
    """The second search of each multi-hop row: the title of its bridge passage (the gold passage the
    first search ranked lowest, an absent one lowest of all, ties to one holding the answer), with
    the question appended when the title alone does not retrieve that passage."""
    bridges = []
    for row, docs in zip(rows, first_results):
        returned = [item.get("document", item)["id"] for item in docs]
        bridges.append(max(gold_ids(row, passages), key=lambda pid: (
            returned.index(pid) if pid in returned else len(returned),
            contains_answer(row, passages[pid]["contents"]))))
    entities = [passage_title(passages[pid]) for pid in bridges]
    joined = [f"{entity} {search_query(row['question'])}" for entity, row in zip(entities, rows)]
    by_title, by_joined = retriever.retrieve(entities), retriever.retrieve(joined)
    searches = []
    for pid, entity, query, title_docs, joined_docs in zip(bridges, entities, joined, by_title, by_joined):
        found = [[item.get("document", item)["id"] for item in docs] for docs in (title_docs, joined_docs)]
        if pid in found[1] and pid not in found[0]:
            searches.append(Search(query, joined_docs, entity))
        else:
            searches.append(Search(entity, title_docs, entity))
    return searches


class ObservationText:
    """Observation text as the RL stage shows it: the whole block, or (with a tokenizer) the
    Search-R1 environment's observation decoded, cut to ``max_obs_length`` tokens."""

    def __init__(self, tokenizer=None, max_obs_length: int | None = None):
        self.env = None
        if tokenizer is not None and max_obs_length:
            from search_r1.envs.search_r1 import SearchR1Environment
            from search_r1.envs.search_tool import SearchTool

            self.env = SearchR1Environment(tokenizer, SearchTool(None), max_obs_length)

    def __call__(self, docs: list[dict]) -> str:
        if self.env is None:
            return format_observation(format_passages(docs))
        return self.env.tokenizer.decode(self.env.render(docs).ids)


def demonstration(row: dict, docs: list[dict], rng: random.Random,
                  observe: ObservationText | None = None, second: Search | None = None) -> dict:
    """One chat row: the RL prompt and a search-then-answer assistant turn.

    ``docs`` are the first search's results (its query is the question); ``second``, when given, is
    a second search made after a think that names what is still missing. ``observe`` renders the
    ``<information>`` blocks (default: the whole, uncut observation). ``answer_in_passages`` says
    whether the last observation contains the answer.
    """
    answer = min(row["golden_answers"], key=len).strip()
    query = search_query(row["question"])
    observe = observe or ObservationText()
    observation = observe(docs)
    assistant = (f"<think> {rng.choice(FIRST_THOUGHTS)} </think>\n"
                 f"<search> {query} </search>"
                 + observation)
    if second is not None:
        middle = rng.choice(MIDDLE_THOUGHTS).format(found=passage_title(docs[0]), missing=second.entity)
        observation = observe(second.docs)
        assistant += f"<think> {middle} </think>\n<search> {second.query} </search>" + observation
    assistant += (f"<think> {rng.choice(FINAL_THOUGHTS).format(answer=answer)} </think>\n"
                  f"<answer> {answer} </answer>")
    # Grounded = the answer survives in what the model is shown (after any cut).
    found = contains_answer(row, observation)
    return {"messages": [{"role": "user", "content": make_prefix(row["question"])},
                         {"role": "assistant", "content": assistant}],
            "data_source": row["data_source"], "id": str(row["id"]),
            "golden_answers": list(row["golden_answers"]), "answer_in_passages": found}


def build_demonstrations(rows: list[dict], retriever, num_demos: int, seed: int,
                         observe: ObservationText | None = None) -> list[dict]:
    """Demonstrations for ``rows``: those whose passages contain the answer first, up to ``num_demos``."""
    rng = random.Random(seed)
    results = retriever.retrieve([search_query(r["question"]) for r in rows])
    demos = [demonstration(row, docs, rng, observe) for row, docs in zip(rows, results)]
    grounded = [d for d in demos if d["answer_in_passages"]]
    others = [d for d in demos if not d["answer_in_passages"]]
    rng.shuffle(grounded)
    rng.shuffle(others)
    chosen = (grounded + others)[:num_demos]
    rng.shuffle(chosen)
    return chosen


def build_mixed_demonstrations(rows: list[dict], retriever, num_demos: int, seed: int,
                               passages: dict[str, dict], multi_hop_fraction: float = 0.5,
                               observe: ObservationText | None = None) -> list[dict]:
    """Two-search demonstrations for multi-hop rows and one-search ones for single-hop rows, mixed.

    ``round(num_demos * multi_hop_fraction)`` come from the multi-hop rows that have two gold passages
    in ``passages`` (those whose second observation holds the answer and whose first does not first,
    then those whose second holds it), the rest from single-hop rows (grounded first), shuffled.
    """
    rng = random.Random(seed)
    observe = observe or ObservationText()
    multi = [r for r in rows if r["data_source"] in MULTI_HOP_SOURCES and len(gold_ids(r, passages)) >= 2]
    single = [r for r in rows if r["data_source"] not in MULTI_HOP_SOURCES]
    results = retriever.retrieve([search_query(r["question"]) for r in multi + single])
    seconds = second_searches(multi, results[:len(multi)], passages, retriever)
    multi_demos, single_demos = [], []
    for row, docs, second in zip(multi, results, seconds):
        demo = demonstration(row, docs, rng, observe, second)
        needed = demo["answer_in_passages"] and not contains_answer(row, observe(docs))
        multi_demos.append(((not needed, not demo["answer_in_passages"]), demo))
    for row, docs in zip(single, results[len(multi):]):
        demo = demonstration(row, docs, rng, observe)
        single_demos.append(((not demo["answer_in_passages"],), demo))
    chosen = preferred(multi_demos, rng)[:round(num_demos * multi_hop_fraction)]
    chosen += preferred(single_demos, rng)[:num_demos - len(chosen)]
    rng.shuffle(chosen)
    return chosen


def preferred(ranked: list[tuple[tuple, dict]], rng: random.Random) -> list[dict]:
    """The demonstrations of ``(preference key, demo)`` pairs, lowest key first, random within a key."""
    rng.shuffle(ranked)
    return [demo for _, demo in sorted(ranked, key=lambda pair: pair[0])]  # sorted is stable


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--qa_dir", default=str(ROOT / "example" / "qa"))
    parser.add_argument("--corpus", default=str(ROOT / "example" / "corpus.jsonl"))
    parser.add_argument("--exclude_dir", action="append", default=[],
                        help="more QA folders whose non-train questions must never be used")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--num_demos", type=int, default=300)
    parser.add_argument("--num_val", type=int, default=32, help="demonstrations kept for SFT val loss")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--retriever_url", default=None)
    parser.add_argument("--tokenizer", default=None,
                        help="HF tokenizer folder; with --max_obs_length, cut observations as RL does")
    parser.add_argument("--max_obs_length", type=int, default=None,
                        help="token budget of one observation (the RL stage's data.max_obs_length)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--multi_hop_searches", type=int, choices=(1, 2), default=1,
                        help="searches in a multi-hop demonstration (2: mixed with one-search single-hop demos)")
    parser.add_argument("--multi_hop_fraction", type=float, default=0.5,
                        help="with --multi_hop_searches 2, the share of demonstrations that are multi-hop")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    """Write ``train.jsonl`` and ``val.jsonl`` under ``--output_dir``; returns (and prints) their statistics."""
    args = parse_args(argv)
    if not 0 <= args.multi_hop_fraction <= 1:
        raise ValueError(f"--multi_hop_fraction must be in [0, 1], got {args.multi_hop_fraction}")
    qa_dir = Path(args.qa_dir)
    held_out = held_out_questions([qa_dir, *map(Path, args.exclude_dir)])
    rows = training_questions(qa_dir, held_out)
    if not rows:
        raise ValueError(f"no training questions under {qa_dir} (files named train*.jsonl)")
    retriever = make_retriever(args.corpus, args.topk, args.retriever_url)
    observe = ObservationText()
    if args.tokenizer and args.max_obs_length:
        from transformers import AutoTokenizer

        observe = ObservationText(AutoTokenizer.from_pretrained(args.tokenizer), args.max_obs_length)
    elif args.max_obs_length:
        raise ValueError("--max_obs_length needs --tokenizer (observations are cut in tokens)")
    num_demos = args.num_demos + args.num_val
    if args.multi_hop_searches == 1:
        demos = build_demonstrations(rows, retriever, num_demos, args.seed, observe)
    else:
        passages = load_passages(args.corpus, {pid for r in rows for pid in r.get("gold_passage_ids") or []})
        demos = build_mixed_demonstrations(rows, retriever, num_demos, args.seed, passages,
                                           args.multi_hop_fraction, observe)
    leaked = [d["id"] for d in demos if normalize_text(d["messages"][0]["content"].split("Question: ")[-1]) in held_out]
    assert not leaked, f"held-out questions leaked into SFT data: {leaked[:5]}"
    out = Path(args.output_dir).expanduser()
    write_jsonl(demos[args.num_val:], out / "train.jsonl")
    write_jsonl(demos[:args.num_val], out / "val.jsonl")
    stats = {"train": len(demos) - args.num_val, "val": min(args.num_val, len(demos)),
             "candidates": len(rows), "held_out_questions": len(held_out),
             "answer_in_passages": sum(d["answer_in_passages"] for d in demos),
             "by_source": {s: sum(d["data_source"] == s for d in demos) for s in sorted({d["data_source"] for d in demos})},
             "by_searches": {n: sum(d["messages"][1]["content"].count("<search>") == n for d in demos)
                             for n in sorted({d["messages"][1]["content"].count("<search>") for d in demos})},
             "output_dir": str(out)}
    print(json.dumps(stats))
    return stats


if __name__ == "__main__":
    main()
