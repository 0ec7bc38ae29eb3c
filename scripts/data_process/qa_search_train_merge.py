"""Merged Search-R1 training set: the ``train`` split of each source into ``train.parquet``.

    python scripts/data_process/qa_search_train_merge.py --local_dir data/nq_hotpotqa_train \
        --data_sources nq,hotpotqa [--input_dir example/qa]

Every row's ``extra_info.uid`` (``<source>-train-<index>``) is unique across the merged sources.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import qa_common  # noqa: E402


def main(argv=None) -> None:
    args = qa_common.parse_args(__doc__.splitlines()[0], default_sources="nq,hotpotqa", argv=argv)
    qa_common.setup_logging()
    rows = qa_common.build_train(qa_common.split_sources(args.data_sources), args)
    qa_common.write_parquet(rows, Path(args.local_dir) / "train.parquet")


if __name__ == "__main__":
    main()
