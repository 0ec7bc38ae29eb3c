"""The trajectory report at size: file size, build time, and the browser's load and filter times.

    python benchmarks/report_page.py [--questions 1000] [--repeats 5]

Records: ``--questions`` validation records on the real questions of example/qa, most of 4 turns
(3 searches, each returning 3 real passages of example/corpus.jsonl rendered by the environment's
own functions: first the question's Search-R1-retrieved passages, then random ones; then an
answer); a tenth answer without searching, a tenth write text outside the tags first, a quarter
answer right.
Measured: the Python build of ``python -m search_r1.report`` (single run, and ``--compare`` of the
run with a copy whose answers differ), the HTML size, and in headless Chromium (Debian's package,
driven by Playwright) the time from navigation to the first page of cards rendered, and per
interaction (each filter on and off, next page, a text search) the time until the next frame after
the change (the page's script, style, layout: the 2nd ``requestAnimationFrame``), median of
``--repeats``. Writes benchmarks/results/report_page.json.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (str(REPO), str(REPO / "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from common import save_report  # noqa: E402

from search_r1.envs.search_r1.prompts import INVALID_ACTION_MESSAGE, format_observation, make_prefix  # noqa: E402
from search_r1.search.passages import format_passages  # noqa: E402
from search_r1.report import __main__ as cli  # noqa: E402

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
# One interaction in the page, timed from the change to the second animation frame after it.
TIMED = """async (action) => {
  const start = performance.now();
  action === "next" ? document.querySelector("nav.pager button.next").click() : (() => {
    const [kind, value] = action.split(":");
    const node = kind === "filter" ? document.querySelector(`input[data-filter=${value}]`) : document.getElementById("text");
    if (kind === "filter") node.checked = !node.checked; else node.value = value;
    node.dispatchEvent(new Event(kind === "filter" ? "change" : "input"));
  })();
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
  return {ms: performance.now() - start, cards: document.querySelectorAll("article.question").length,
          status: document.getElementById("status").textContent};
}"""


def make_records(count: int, seed: int = 0) -> list[dict]:
    """``count`` four-turn records on real questions and passages (see the module docstring)."""
    rng = random.Random(seed)
    corpus = [json.loads(line) for line in (REPO / "example" / "corpus.jsonl").open()]
    by_id = {doc["id"]: doc for doc in corpus}
    questions = [(path.parent.name, json.loads(line)) for path in sorted((REPO / "example" / "qa").glob("*/test.jsonl"))
                 for line in path.open()]
    records = []
    for index in range(count):
        source, row = questions[index % len(questions)]
        gold = row["golden_answers"]
        right = rng.random() < 0.25
        invalid = rng.random() < 0.1
        output = "Let me look this up. </search>" + INVALID_ACTION_MESSAGE if invalid else ""
        searches = 0 if rng.random() < 0.1 else 3
        linked = [by_id[i] for i in row["sr1_retrieved_passage_ids"] if i in by_id][:3]
        for turn in range(searches):
            docs = [{"document": doc} for doc in (linked if turn == 0 and linked else rng.sample(corpus, 3))]
            output += (f"<think>Step {turn + 1}: I need more about {row['question'][:40]}.</think>\n"
                       f"<search> {row['question'][:60]} part {turn + 1} </search>"
                       + format_observation(format_passages(docs)))
        answer = gold[0] if right else "unknown"
        output += f"<think>The passages suggest {answer}.</think>\n<answer> {answer} </answer>"
        records.append({"data_source": source, "uid": f"{source}-{index}", "question": row["question"] + "?",
                        "gold": gold, "input": make_prefix(row["question"]), "output": output, "answer": answer,
                        "em": float(right), "score": float(right), "turns": searches + 1 + invalid,
                        "valid_search": searches, "valid_action": searches + 1,
                        "finished": 1, "truncated": 0, "response_tokens": 180, "response_length": 1500})
    return records


def build(args: list[str]) -> float:
    start = time.perf_counter()
    assert cli.main(args) == 0
    return time.perf_counter() - start


def browse(path: Path, repeats: int, chromium: str) -> dict:
    """Load and interaction times of the report at ``path`` (ms, medians over ``repeats`` loads)."""
    from playwright.sync_api import sync_playwright

    actions = ["filter:wrong", "filter:wrong", "filter:no_search", "filter:no_search", "filter:malformed",
               "filter:malformed", "filter:found_not_given", "filter:found_not_given", "next", "text:wh", "text:"]
    loads, ready, timings, shown = [], [], {action: [] for action in dict.fromkeys(actions)}, {}
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True,
                                                                args=FLAGS, viewport={"width": 1280, "height": 900})
        for _ in range(repeats):
            tab = context.new_page()
            start = time.perf_counter()
            tab.goto(path.as_uri())
            tab.wait_for_selector("body[data-ready='1']", timeout=120_000)
            loads.append((time.perf_counter() - start) * 1000)
            ready.append(tab.evaluate("window.reportTimings.ready_ms"))
            for position, action in enumerate(actions):
                result = tab.evaluate(TIMED, action)
                key = action if actions.index(action) == position else f"{action} (off)"
                timings.setdefault(key, []).append(result["ms"])
                shown[key] = result["status"]
            tab.close()
        context.close()
    return {"load_to_ready_ms": statistics.median(loads), "page_ready_ms": statistics.median(ready),
            "interactions_ms": {key: round(statistics.median(values), 1) for key, values in timings.items() if values},
            "status_after": shown}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("error: no chromium binary on PATH (Debian: apt-get install -y chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        records = make_records(args.questions)
        for name, rows in (("a", records), ("b", make_records(args.questions, seed=1))):
            (root / name).mkdir()
            (root / name / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        jsonl_mb = (root / "a" / "questions.jsonl").stat().st_size / 1e6
        single_s = build([str(root / "a")])
        compare_s = build(["--compare", str(root / "a"), str(root / "b")])
        results = {}
        for name, path, seconds in (("single", root / "a" / "report.html", single_s),
                                    ("compare", root / "b" / "compare.html", compare_s)):
            results[name] = {"build_s": round(seconds, 2), "html_mb": round(path.stat().st_size / 1e6, 2),
                             **browse(path, args.repeats, chromium)}
    save_report("report_page", {"questions": args.questions, "turns": 4, "passages_per_search": 3,
                                "questions_jsonl_mb": round(jsonl_mb, 2), "repeats": args.repeats,
                                "chromium": chromium, **results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
