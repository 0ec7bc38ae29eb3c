"""The report in a real browser: headless Chromium (Debian's ``chromium``) driven by Playwright.

It opens the report that ``bash evaluate.sh --max_per_source 2 --html`` wrote (the embedded CPU
default: SmolLM2, the example/ test sets, a local BM25 retriever, the transformers engine),
applies filters and reads the DOM back; and it opens a handmade report whose passage, title and
question carry ``<script>`` and ``onerror`` markup, which must show as text and never run.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from search_r1.report import __main__ as cli
from search_r1.report import page as report_page
from verl.trainer.ppo.validation import read_records

from .helpers import handmade, write_jsonl

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian's chromium package: "
                                                          "apt-get install -y chromium; .ci/run installs it as root)")]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements/cpu.txt)")
# No connection leaves the machine: without the background-networking flags Chromium keeps trying.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def evaluation(embedded_evaluation) -> Path:
    """The output folder of the session's real ``evaluate.sh --max_per_source 2 --html`` run."""
    result, out, _ = embedded_evaluation
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert f"and {out / 'report.html'}" in result.stdout  # the closing line names it
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium with a new, empty profile."""
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")), executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1280, "height": 900})
        yield context
        context.close()


def _open(browser, path: Path):
    """The page at ``path`` once its script has rendered, and the dialogs, console lines and errors it produced."""
    tab = browser.new_page()
    events: list[str] = []
    tab.on("console", lambda message: events.append(f"console: {message.text}"))
    tab.on("pageerror", lambda error: events.append(f"error: {error}"))
    tab.on("dialog", lambda dialog: (events.append(f"dialog: {dialog.message}"), dialog.dismiss()))
    tab.goto(path.as_uri())
    tab.wait_for_selector("body[data-ready='1']", timeout=30_000)
    return tab, events


def _counts(tab) -> dict[str, int]:
    return {node.get_attribute("data-count"): int(node.text_content()) for node in tab.query_selector_all("[data-count]")}


def test_the_report_of_an_evaluate_run_filters_in_the_browser(evaluation, browser, tmp_path):
    records = read_records(evaluation / "questions.jsonl")
    flags = [report_page.question_side(record)["flags"] for record in records]
    tab, events = _open(browser, evaluation / "report.html")
    assert tab.locator("table.summary").first.locator("tbody tr").count() == 8  # 7 sources and the average
    assert tab.locator("article.question").count() == 14 and tab.text_content("#status") == "14 of 14 questions"
    expected = Counter(flag for row in flags for flag in row)
    assert _counts(tab) == {key: expected[key] for key, _, _ in report_page.FILTERS}

    cards = tab.locator("article.question")
    for key, _, _ in report_page.FILTERS:  # each filter alone: the cards Python flags, in file order
        tab.check(f"input[data-filter={key}]")
        selected = [str(i + 1) for i, row in enumerate(flags) if key in row]
        assert cards.evaluate_all("cards => cards.map(c => c.dataset.n)") == selected, key
        assert tab.text_content("#status") == f"{len(selected)} of 14 questions"
        assert tab.locator("p.empty").count() == (not selected)
        tab.uncheck(f"input[data-filter={key}]")
    tab.select_option("#source", "nq")
    assert cards.count() == 2 and cards.first.locator("h3").text_content() == records[0]["question"]
    assert cards.first.locator("li.turn").count() == len(report_page.question_side(records[0])["turns"])
    tab.select_option("#source", "")
    tab.fill("#text", records[3]["question"][:30])
    assert cards.count() == 1 and cards.first.get_attribute("data-n") == "4"
    tab.fill("#text", "")
    tab.select_option("#size", "10")
    assert cards.count() == 10 and tab.text_content("nav.pager .page") == "page 1 of 2"
    tab.locator("nav.pager button.next").first.click()
    assert cards.evaluate_all("cards => cards.map(c => c.dataset.n)") == [str(n) for n in range(11, 15)]

    tab.screenshot(path=str(tmp_path / "report.png"))
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert events == []


def test_markup_in_passages_shows_as_text_and_never_runs(browser, tmp_path):
    path = write_jsonl(tmp_path / "run" / "questions.jsonl", handmade())
    assert cli.main([str(path.parent)]) == 0
    tab, events = _open(browser, path.parent / "report.html")
    assert tab.evaluate("typeof window.pwned") == "undefined" and events == []
    card = tab.locator("article.question").nth(4)
    assert card.locator("h3").text_content() == "</script><script>window.pwned = 'question'</script> who?"
    document = card.locator("li.document").first
    assert document.locator(".title").text_content() == "\"<script>window.pwned = 'title'</script>\""
    passage = document.locator(".passage")
    assert passage.text_content().startswith("<script>window.pwned = 'passage'; alert(1)</script> <img src=x")
    assert passage.locator("mark.gold").all_text_contents() == ["gold answer"]
    assert passage.locator("script, img").count() == 0 and card.locator(".answer-text").text_content() == "<i>nothing</i>"
    assert passage.is_visible()

    tab.check("input[data-filter=found_not_given]")
    assert tab.locator("article.question").count() == 2 and tab.text_content("#status") == "2 of 5 questions"
    assert tab.evaluate("typeof window.pwned") == "undefined" and events == []
