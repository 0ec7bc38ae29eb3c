"""Compare two evaluation results: ``python -m verl.trainer.evaluation.compare A.json B.json``.

Prints, per source, both EMs, ``B - A`` and its 95% bootstrap interval (paired where both files
hold the same questions, else unpaired), and the same for the average over the common sources.
``--out FILE`` also writes the table (``.md``) or the numbers (``.json``). ``evaluate.sh --compare``
runs this.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from verl.trainer.evaluation.report import compare, compare_markdown, load_report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="evaluation JSON (the baseline)")
    parser.add_argument("b", help="evaluation JSON (the one compared with it)")
    parser.add_argument("--out", default=None, help="also write the comparison (.md or .json)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = parser.parse_args(argv)
    try:
        table_a, table_b = load_report(args.a), load_report(args.b)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result = compare(table_a, table_b, seed=args.seed)
    text = compare_markdown(result, "A", "B")
    print(f"A = {args.a}\nB = {args.b}\n\n{text}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".json":
            out.write_text(json.dumps({"a": args.a, "b": args.b, **result}, indent=1) + "\n")
        else:
            out.write_text(f"A = `{args.a}`, B = `{args.b}`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
