"""Merged Search-R1 evaluation set: each source's ``test`` (else ``dev``, else ``train``) split.

    python scripts/data_process/qa_search_test_merge.py --local_dir data/nq_hotpotqa_train \
        --data_sources nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,bamboogle \
        [--input_dir example/qa]

Writes ``test.parquet``; ``val/test_score/<data_source>`` metrics come from its ``data_source``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import qa_common  # noqa: E402

ALL_SOURCES = "nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,bamboogle"


def main(argv=None) -> None:
    args = qa_common.parse_args(__doc__.splitlines()[0], default_sources=ALL_SOURCES, argv=argv)
    qa_common.setup_logging()
    rows = qa_common.build_test(qa_common.split_sources(args.data_sources), args)
    qa_common.write_parquet(rows, Path(args.local_dir) / "test.parquet")


if __name__ == "__main__":
    main()
