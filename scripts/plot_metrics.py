"""Plot a run's metric log (``metrics.jsonl`` of the jsonl logger) as PNG curves.

    python scripts/plot_metrics.py checkpoints/<experiment>/logs/metrics.jsonl --out plots/

Panels: training score (and validation score per data source), response length, searches per
answer (env/number_of_valid_search), KL, entropy, and the timing split of a step.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

PANELS = {
    "score": ("critic/score/mean", "val/test_score/"),
    "response_length": ("response_length/mean", "response_length/max"),
    "searches": ("env/number_of_valid_search", "env/number_of_actions/mean", "env/finish_ratio"),
    "kl": ("actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty"),
    "entropy": ("actor/entropy",),
    "timing": ("timing_s/",),
}


def read_metrics(path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` from a jsonl log; non-numeric values are skipped.

    Raises:
        ValueError: a line is not JSON (names the file and line number).
    """
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not JSON ({error})") from error
            step = int(row.pop("step", number))
            for key, value in row.items():
                if isinstance(value, (int, float)):
                    series[key].append((step, float(value)))
    return series


def _matching(series: dict, patterns: tuple[str, ...]) -> list[str]:
    keys = []
    for pattern in patterns:
        keys += sorted(k for k in series if (k.startswith(pattern) if pattern.endswith("/") else k == pattern))
    return keys


def plot(series: dict, out_dir: str | Path) -> list[Path]:
    """One PNG per panel with at least one metric present; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, patterns in PANELS.items():
        keys = _matching(series, patterns)
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for key in keys:
            steps, values = zip(*series[key])
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=key)
        ax.set_xlabel("training step")
        ax.set_title(name)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        path = out_dir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="metrics.jsonl written by trainer.logger=[...,jsonl]")
    parser.add_argument("--out", default=None, help="output folder (default: beside the log, plots/)")
    args = parser.parse_args(argv)
    out = args.out or Path(args.metrics).parent / "plots"
    for path in plot(read_metrics(args.metrics), out):
        print(path)


if __name__ == "__main__":
    main()
