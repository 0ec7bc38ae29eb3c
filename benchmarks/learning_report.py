"""The learning runs' reports: a run's PNG (validation EM by source, training curves) and, over several
runs' JSONs (``benchmarks/learning_run.py`` output), the Markdown tables of docs/benchmarks_learning.md
and the side-by-side JSON of ``recipes_learning.json``.

    python benchmarks/learning_run.py --report benchmarks/results/learning_grpo.json benchmarks/results/learning_gae.json \
        [--report_json benchmarks/results/recipes_learning.json]
"""

from __future__ import annotations

import json
from pathlib import Path

# What a curve point holds per training step (metric key -> label).
CURVES = {"critic/score/mean": "training score", "reward_extra/em": "training EM", "reward_extra/f1": "training F1",
          "response_length/mean": "response tokens", "env/number_of_valid_search": "searches / question",
          "actor/entropy": "entropy", "actor/kl_loss": "KL (loss)", "actor/reward_kl_penalty": "KL (reward)",
          "actor/ppo_kl": "KL (old policy)", "critic/advantages/max": "max advantage", "actor/llds_loss": "LLDS loss",
          "health/broken_tags": "broken tags", "health/no_answer": "no answer", "health/think_words": "think words",
          "health/lld/pos_logprob": "log-lik. of A > 0 responses", "health/alarm": "health alarm"}
PLOT_COLUMNS = 4  # panels a row in the run's PNG


def plot(result: dict, path: Path) -> None:
    """Training curves and validation EM per source by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in CURVES if any(k in r for r in result["curves"])]
    # a grid of PLOT_COLUMNS panels a row, validation EM first: readable at the page's width
    rows = -(-(len(keys) + 1) // PLOT_COLUMNS)
    fig, grid = plt.subplots(rows, PLOT_COLUMNS, figsize=(4.0 * PLOT_COLUMNS, 3.0 * rows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(keys) + 1:]:
        ax.set_visible(False)
    steps = sorted(result["evaluations"], key=int)
    ax = axes[0]
    for source in (result["evaluations"][steps[0]]["table"]["sources"] if steps else []):
        ax.plot([int(s) for s in steps], [result["evaluations"][s]["table"]["sources"][source]["em"] for s in steps],
                marker="o", label=source)
    if steps:
        ax.plot([int(s) for s in steps], [result["evaluations"][s]["table"]["average"]["em"] for s in steps],
                marker="s", color="black", label="average")
        ax.legend(fontsize=7)
    ax.set_title(f"validation EM ({result['label']})")
    ax.set_xlabel("step")
    for ax, key in zip(axes[1:], keys):
        ax.plot([r["step"] for r in result["curves"] if key in r], [r[key] for r in result["curves"] if key in r])
        ax.set_title(CURVES[key])
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(paths: list[str]) -> str:
    """Markdown: each run's evaluation tables by step, then the runs side by side (Search-R1 Table 3)."""
    from verl.trainer.evaluation.report import ordered_sources, to_markdown

    runs = [json.loads(Path(p).read_text()) for p in paths]
    parts = []
    for run in runs:
        parts.append(f"### {run['algorithm']}: {run['steps']} steps ({run['date']}, commit {run['commit'][:10]})")
        for step, evaluation in sorted(run["evaluations"].items(), key=lambda kv: int(kv[0])):
            parts.append(f"\nStep {step}:\n\n{to_markdown(evaluation['table'])}")
        times = ", ".join(f"{k} {v:.1f} s" for k, v in run["step_time_s"].items())
        parts.append(f"\nMedian step time split: {times}. Goal: {json.dumps(run['goal'])}\n")
    finals = [(r.get("label", r["algorithm"]), r["evaluations"][max(r["evaluations"], key=int)]["table"])
              for r in runs if r["evaluations"]]
    sources = ordered_sources({s for _, t in finals for s in t["sources"]})
    head = "| source | " + " | ".join(f"{a} (final)" for a, _ in finals) + " |"
    lines = [head, "|---" * (len(finals) + 1) + "|"]
    for source in sources:
        cells = [f"{t['sources'][source]['em']:.3f}" if source in t["sources"] else "" for _, t in finals]
        lines.append(f"| {source} | " + " | ".join(cells) + " |")
    lines.append("| **average** | " + " | ".join(f"**{t['average']['em']:.3f}**" for _, t in finals) + " |")
    return "\n".join(parts) + "\n\n" + "\n".join(lines)


def side_by_side(paths: list[str]) -> dict:
    """Runs' JSONs side by side (issue 29's ``recipes_learning.json``): per run and evaluation step the
    EM by source, the seven-source average with its 95% interval, F1, cover-EM and searches per
    question; then every run against the first at each step both evaluated and at each run's last
    evaluation (``"final"``, with the two steps: runs cut by a time budget end a step or two apart),
    each a paired bootstrap over the same questions (:func:`verl.trainer.evaluation.report.compare`)."""
    from verl.trainer.evaluation.report import compare

    runs = [json.loads(Path(p).read_text()) for p in paths]
    labels = [r.get("label", r["algorithm"]) for r in runs]

    def brief(table: dict) -> dict:
        return {"em": {s: row["em"] for s, row in table["sources"].items()},
                "searches": {s: row.get("searches") for s, row in table["sources"].items()},
                **{k: table["average"][k] for k in ("em", "em_ci", "f1", "cover_em", "retrieved", "em_when_retrieved")
                   if k in table["average"]}}

    out = {"runs": {label: {"file": path, "steps": r["steps"], "status": r.get("status", "complete"),
                            "commit": r["commit"], "date": r["date"], "step_time_s": r["step_time_s"].get("step"),
                            "evaluations": {s: brief(e["table"]) for s, e in sorted(r["evaluations"].items(),
                                                                                   key=lambda kv: int(kv[0]))}}
                    for label, path, r in zip(labels, paths, runs)}, "against": labels[0], "comparisons": {}}
    for label, run in zip(labels[1:], runs[1:]):
        common = sorted(set(runs[0]["evaluations"]) & set(run["evaluations"]), key=int)
        pairs = {s: (s, s) for s in common}
        pairs["final"] = (max(runs[0]["evaluations"], key=int), max(run["evaluations"], key=int))
        out["comparisons"][label] = {
            key: {**compare(runs[0]["evaluations"][a]["table"], run["evaluations"][b]["table"])["average"],
                  "steps": [int(a), int(b)]}
            for key, (a, b) in pairs.items()}
    return out
