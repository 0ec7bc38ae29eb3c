"""The retrieval ceiling of the learning run (issue 19 part 2): how often the top-3 passages for the
question itself, over the whole shared corpus, hold a gold answer.

    python benchmarks/learning_ceiling.py [--data data/learning] [--out benchmarks/results/learning_ceiling.json]

For every validation (and training) question of ``benchmarks/learning_data.py``: query = the question
text, top-3 passages from the ~30k-passage shared corpus with BM25 (bm25s) and with the MiniLM
(all-MiniLM-L6-v2) Flat dense index, both built by ``search_r1.search.index_builder`` and served by the
same retriever classes as ``retrieval_server``. A question counts when a SQuAD-normalised gold answer
occurs as whole tokens in one of the three passages (title line included: the model sees it). A policy
that searches the question verbatim and copies an answer from the passages reaches this EM at best;
better queries or a second search can pass it. The JSON holds per-source fractions for both
retrievers, their union, the dense/BM25 ratio, the Table-2 style average, index build and query times,
commit, command, machine and versions.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from search_r1.qa.answers import normalize_answer  # noqa: E402

TOPK = 3
SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


def answer_in_passages(golden_answers, passages: list[str]) -> bool:
    """A non-empty SQuAD-normalised gold answer occurs as whole tokens in a normalised passage."""
    texts = [f" {normalize_answer(p)} " for p in passages]
    golds = [g for g in (normalize_answer(a) for a in golden_answers) if g]
    return any(f" {gold} " in text for gold in golds for text in texts)


def hits(retriever, rows: list[dict], batch_size: int = 64) -> list[bool]:
    """Whether each row's top-``TOPK`` passages for its own question hold a gold answer."""
    out = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        results = retriever.search([r["question"] for r in batch], TOPK)
        out += [answer_in_passages(r["golden_answers"], [h["document"]["contents"] for h in found])
                for r, found in zip(batch, results)]
    return out


def build_indexes(corpus: Path, index_dir: Path) -> dict[str, float]:
    """BM25 and MiniLM Flat indexes over ``corpus`` (cached: built once per index folder); build seconds."""
    from search_r1.search.index_builder import build_bm25, build_dense

    seconds = {}
    if not (index_dir / "bm25" / "DONE").exists():
        start = time.perf_counter()
        build_bm25(str(corpus), str(index_dir))
        seconds["bm25"] = time.perf_counter() - start
        (index_dir / "bm25" / "DONE").write_text("ok\n")
    if not (index_dir / "minilm_Flat.index.DONE").exists():
        start = time.perf_counter()
        build_dense(str(corpus), str(index_dir), "minilm", batch_size=128)
        seconds["dense"] = time.perf_counter() - start
        (index_dir / "minilm_Flat.index.DONE").write_text("ok\n")
    return seconds


def retrievers(corpus: Path, index_dir: Path) -> dict:
    from search_r1.search.loading import load_bm25_retriever, load_dense_retriever

    return {"bm25": load_bm25_retriever(str(index_dir / "bm25"), str(corpus)),
            "dense": load_dense_retriever(str(index_dir / "minilm_Flat.index"), str(corpus), "minilm")}


def ceiling(rows_by_source: dict[str, list[dict]], found: dict[str, dict[str, list[bool]]]) -> dict:
    """Per-source fractions of both retrievers and their union, with the mean over sources."""
    table = {}
    for source, rows in rows_by_source.items():
        entry = {"count": len(rows)}
        for name, by_source in found.items():
            entry[name] = float(np.mean(by_source[source]))
        entry["either"] = float(np.mean([any(f[source][i] for f in found.values()) for i in range(len(rows))]))
        entry["dense_over_bm25"] = entry["dense"] / entry["bm25"] if entry.get("bm25") else None
        table[source] = entry
    names = [*found, "either"]
    table["average"] = {name: float(np.mean([table[s][name] for s in rows_by_source])) for name in names}
    pooled = sum(len(r) for r in rows_by_source.values())
    table["pooled"] = {name: float(sum(table[s][name] * len(rows_by_source[s]) for s in rows_by_source) / pooled)
                       for name in names}
    table["pooled"]["count"] = pooled
    return table


def load_split(data: Path, split: str) -> dict[str, list[dict]]:
    import learning_data

    out = {}
    for source in SOURCES:
        path = data / "qa" / source / f"{split}.jsonl"
        if path.exists():
            out[source] = learning_data.read_jsonl(path)
    return out


def markdown(result: dict, split: str = "validation") -> str:
    lines = ["| source | questions | BM25 | MiniLM dense | either | dense / BM25 |", "|---|---|---|---|---|---|"]
    for source, row in result[split].items():
        if source in ("average", "pooled"):
            continue
        ratio = f"{row['dense_over_bm25']:.2f}" if row["dense_over_bm25"] is not None else ""
        lines.append(f"| {source} | {row['count']} | {row['bm25']:.3f} | {row['dense']:.3f} | {row['either']:.3f} | {ratio} |")
    avg, pooled = result[split]["average"], result[split]["pooled"]
    lines.append(f"| **average** (of sources) | {pooled['count']} | {avg['bm25']:.3f} | {avg['dense']:.3f} | "
                 f"{avg['either']:.3f} | {avg['dense'] / avg['bm25']:.2f} |")
    lines.append(f"| pooled | {pooled['count']} | {pooled['bm25']:.3f} | {pooled['dense']:.3f} | {pooled['either']:.3f} | |")
    return "\n".join(lines)


def provenance() -> dict:
    import bm25s
    import faiss
    import torch
    import transformers

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "date": time.strftime("%Y-%m-%d"), "command": " ".join([sys.executable, *sys.argv]),
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "cpus": __import__("os").cpu_count()},
            "versions": {"bm25s": bm25s.__version__, "faiss": faiss.__version__, "torch": torch.__version__,
                         "transformers": transformers.__version__}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT / "data" / "learning"), help="benchmarks/learning_data.py output")
    parser.add_argument("--index_dir", default=None, help="default: <data>/indexes")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "learning_ceiling.json"))
    args = parser.parse_args(argv)
    data = Path(args.data)
    if not (data / "selection.json").exists():
        import learning_data

        learning_data.main(["--out", str(data)])
    corpus, index_dir = data / "corpus.jsonl", Path(args.index_dir or data / "indexes")
    result = {"build_s": build_indexes(corpus, index_dir), "query_s": {}, "topk": TOPK,
              "selection": json.loads((data / "selection.json").read_text())["counts"]}
    loaded = retrievers(corpus, index_dir)
    for split, key in (("test", "validation"), ("train", "train")):
        rows = load_split(data, split)
        found = {}
        for name, retriever in loaded.items():
            start = time.perf_counter()
            found[name] = {source: hits(retriever, source_rows) for source, source_rows in rows.items()}
            result["query_s"][f"{key}/{name}"] = time.perf_counter() - start
        result[key] = ceiling(rows, found)
    result.update(provenance())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result, "validation"))
    print(f"\ntrain:\n{markdown(result, 'train')}\nwrote {out}")


if __name__ == "__main__":
    main()
