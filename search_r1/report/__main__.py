"""``python -m search_r1.report PATH [-o OUT.html]`` and ``--compare A B``: write the HTML report.

Exit codes: 0 written, 2 a bad input (one line naming the file, line or key).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from search_r1.report import compare_html, inputs, report_html


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m search_r1.report", description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", help="evaluate.sh output folder, questions.jsonl, or validation dump")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two runs side by side (flips first)")
    parser.add_argument("-o", "--output", help="default: PATH/report.html, FILE.html, or B's compare.html")
    parser.add_argument("--max-questions", type=int, default=None,
                        help="trajectories shown at most, taken source by source (default: all)")
    args = parser.parse_args(argv)
    if (args.path is None) == (args.compare is None):
        parser.error("give either PATH or --compare A B")
    if args.max_questions is not None and args.max_questions < 1:
        parser.error(f"--max-questions must be at least 1, got {args.max_questions}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.compare:
            a, b = (inputs.load_run(path) for path in args.compare)
            a.label, b.label = f"A: {a.label}", f"B: {b.label}"
            html = compare_html(a, b, f"{a.label} vs {b.label}")
            default = inputs.default_output(args.compare[1])
            output = Path(args.output) if args.output else default.with_name("compare.html")
        else:
            run = inputs.load_run(args.path)
            html = report_html(run, f"Trajectories: {run.label}", args.max_questions)
            output = Path(args.output) if args.output else inputs.default_output(args.path)
        output.write_text(html, encoding="utf-8")
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {output} ({output.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
