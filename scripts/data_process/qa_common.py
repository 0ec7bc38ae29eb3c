"""Shared code of the QA data scripts: read FlashRAG-style QA, build Search-R1 rows
(:mod:`search_r1.qa.rows`, which the RL data loader also applies to FlashRAG files), write parquet.

Input, either
* ``--input_dir DIR``: ``DIR/<data_source>/<split>.jsonl`` with rows ``{"id", "question",
  "golden_answers": [str, ...]}`` (FlashRAG's layout; extra fields are ignored), or
* no ``--input_dir``: ``datasets.load_dataset("RUC-NLPIR/FlashRAG_datasets", <data_source>)``, as
  Search-R1's scripts do (needs hub access).

Output rows (Search-R1's schema, plus a ``uid``)::

    {"data_source": "nq",
     "prompt": [{"role": "user", "content": make_prefix(question)}],
     "ability": "fact-reasoning",
     "reward_model": {"style": "rule", "ground_truth": {"target": [answers]}},
     "extra_info": {"split": "train", "index": 17, "uid": "nq-train-17"}}

``extra_info.index`` is the row's position in its source split (as in Search-R1), so it repeats
across sources; ``extra_info.uid`` = ``<data_source>-<split>-<index>`` is unique across a merged file
(Search-R1 reused ``index`` and GRPO grouped unrelated questions that shared it).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Iterable

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a plain script from any directory
    sys.path.insert(0, str(REPO_ROOT))

from search_r1.envs.search_r1.prompts import TEMPLATES, prompt_messages  # noqa: E402
from search_r1.qa import rows  # noqa: E402
from search_r1.qa.rows import is_well_formed  # noqa: E402

logger = logging.getLogger("qa_data")

HF_DATASET = "RUC-NLPIR/FlashRAG_datasets"
SPLITS = ("train", "dev", "test")
TEST_SPLIT_ORDER = ("test", "dev", "train")  # Search-R1's qa_search_test_merge.py preference
MAX_REPORTED_IDS = 5


def make_row(row: dict, index: int, data_source: str, split: str, template: str = "base") -> dict:
    """The Search-R1 row of a well-formed FlashRAG row, its prompt in the named template."""
    return rows.make_row(row, index, data_source, split, lambda question: prompt_messages(question, template))


class MalformedRowsError(ValueError):
    """Raised under ``--strict`` when a split holds rows without a question or answers."""


def parse_args(description: str, default_sources: str | None, argv=None) -> argparse.Namespace:
    """The common command line: --local_dir, --input_dir, --data_sources, --template, --strict."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--local_dir", default="./data/nq_search", help="output folder")
    parser.add_argument("--input_dir", default=None,
                        help="FlashRAG-style folder <input_dir>/<source>/<split>.jsonl; "
                             f"default: load {HF_DATASET} from the hub")
    if default_sources is not None:
        parser.add_argument("--data_sources", default=default_sources,
                            help="comma-separated data sources")
    parser.add_argument("--template", default="base", choices=sorted(TEMPLATES),
                        help="prompt template (base = Search-R1's, byte for byte)")
    parser.add_argument("--strict", action="store_true",
                        help="fail on rows without a question or answers instead of skipping them")
    return parser.parse_args(argv)


def split_sources(text: str) -> list[str]:
    """``"nq,hotpotqa"`` -> ``["nq", "hotpotqa"]``.

    Raises:
        ValueError: empty list or a source named twice (its uids would collide).
    """
    sources = [s.strip() for s in text.split(",") if s.strip()]
    if not sources:
        raise ValueError(f"--data_sources {text!r} names no data source")
    duplicates = sorted({s for s in sources if sources.count(s) > 1})
    if duplicates:
        raise ValueError(f"--data_sources names {duplicates} more than once")
    return sources


class QASource:
    """The splits of one data source, from a local folder or the FlashRAG hub dataset."""

    def __init__(self, data_source: str, input_dir: str | None):
        self.data_source = data_source
        self.input_dir = Path(input_dir) if input_dir else None
        self._hub = None
        if self.input_dir is not None and not (self.input_dir / data_source).is_dir():
            raise FileNotFoundError(f"no folder {self.input_dir / data_source} for data source "
                                    f"{data_source!r}")

    def splits(self) -> list[str]:
        """Split names this source provides."""
        if self.input_dir is not None:
            return [s for s in SPLITS if (self.input_dir / self.data_source / f"{s}.jsonl").exists()]
        return list(self._hub_dataset().keys())

    def rows(self, split: str) -> list[dict]:
        """All rows of a split, in file order.

        Raises:
            FileNotFoundError / KeyError: the split does not exist.
            ValueError: a line is not valid JSON (names the file and line).
        """
        if self.input_dir is None:
            return [dict(row) for row in self._hub_dataset()[split]]
        path = self.input_dir / self.data_source / f"{split}.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"no split file {path}")
        return list(_read_jsonl(path))

    def test_split(self) -> str:
        """``test``, else ``dev``, else ``train``.

        Raises:
            FileNotFoundError: the source has none of them.
        """
        available = self.splits()
        for split in TEST_SPLIT_ORDER:
            if split in available:
                return split
        raise FileNotFoundError(f"data source {self.data_source!r} has no test/dev/train split")

    def _hub_dataset(self):
        if self._hub is None:
            import datasets  # only needed without --input_dir

            self._hub = datasets.load_dataset(HF_DATASET, self.data_source)
        return self._hub


def _read_jsonl(path: Path) -> Iterable[dict]:
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: invalid JSON ({err.msg})") from err


def process_split(source: QASource, split: str, template: str, strict: bool) -> list[dict]:
    """Rows of one split converted; malformed rows reported (count + first ids) and skipped.

    Raises:
        MalformedRowsError: ``strict`` and the split holds malformed rows.
    """
    raw = source.rows(split)
    out, bad_ids = [], []
    for index, row in enumerate(raw):
        if is_well_formed(row):
            out.append(make_row(row, index, source.data_source, split, template))
        else:
            bad_ids.append(str(row.get("id", f"line {index + 1}")))
    if bad_ids:
        message = (f"{source.data_source}/{split}: {len(bad_ids)} of {len(raw)} rows lack a question "
                   f"or answers; first ids: {bad_ids[:MAX_REPORTED_IDS]}")
        if strict:
            raise MalformedRowsError(message)
        logger.warning("%s (skipped)", message)
    logger.info("%s/%s: %d rows", source.data_source, split, len(out))
    return out


def write_parquet(rows: list[dict], path: Path) -> None:
    """Write rows to parquet (creates the folder).

    Raises:
        ValueError: no rows, or two rows share a uid.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise ValueError(f"no rows to write to {path}")
    uids = [row["extra_info"]["uid"] for row in rows]
    if len(set(uids)) != len(uids):
        raise ValueError(f"duplicate uids in {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    logger.info("wrote %d rows to %s", len(rows), path)


def build_train(sources: list[str], args: argparse.Namespace) -> list[dict]:
    """Merged ``train`` split of the given sources."""
    rows = []
    for name in sources:
        rows += process_split(QASource(name, args.input_dir), "train", args.template, args.strict)
    return rows


def build_test(sources: list[str], args: argparse.Namespace) -> list[dict]:
    """Merged evaluation rows: each source's ``test``, else ``dev``, else ``train`` split."""
    rows = []
    for name in sources:
        source = QASource(name, args.input_dir)
        rows += process_split(source, source.test_split(), args.template, args.strict)
    return rows


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
