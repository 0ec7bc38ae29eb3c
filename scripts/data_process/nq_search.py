"""NQ for Search-R1: ``train.parquet`` and ``test.parquet`` of the ``nq`` data source.

    python scripts/data_process/nq_search.py --local_dir data/nq_search [--input_dir example/qa]

Row schema and options: see ``qa_common``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import qa_common  # noqa: E402


def main(argv=None) -> None:
    args = qa_common.parse_args(__doc__.splitlines()[0], default_sources=None, argv=argv)
    qa_common.setup_logging()
    out = Path(args.local_dir)
    qa_common.write_parquet(qa_common.build_train(["nq"], args), out / "train.parquet")
    qa_common.write_parquet(qa_common.build_test(["nq"], args), out / "test.parquet")


if __name__ == "__main__":
    main()
