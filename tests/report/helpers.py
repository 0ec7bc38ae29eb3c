"""Handmade records for the report's tests: trajectories written with the environment's own text."""

from __future__ import annotations

import json
import re
from pathlib import Path

from search_r1.envs.search_r1.prompts import INVALID_ACTION_MESSAGE, format_observation, make_prefix
from search_r1.search.passages import format_passages
from search_r1.envs.search_r1.parsing import extract_solution

REPO = Path(__file__).resolve().parents[2]
PAGE_DATA = re.compile(r'<script type="application/json" id="report-data">(.*?)</script>', re.DOTALL)


def observation(*docs: tuple[str, str]) -> str:
    """The ``<information>`` block of (title, text) documents, as the search loop renders it."""
    return format_observation(format_passages([{"document": {"contents": f'"{t}"\n{x}'}} for t, x in docs]))


def record(question: str, output: str, gold: list[str], em: float, searches: int, source: str = "nq",
           **extra) -> dict:
    """A validation record (``verl.trainer.ppo.validation.batch_records``'s keys) of one trajectory."""
    answer = extract_solution(output)
    base = {"data_source": source, "uid": f"{source}-{len(question)}", "question": question, "gold": gold,
            "ground_truth": {"target": gold}, "input": make_prefix(question), "output": output,
            "answer": answer, "score": em, "em": em, "turns": searches + 1, "valid_action": searches + 1,
            "valid_search": searches, "finished": int(answer is not None), "truncated": 0,
            "response_tokens": 40, "response_length": 120}
    return base | extra


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def page_data(html: str) -> dict:
    """The JSON blob the page renders its questions from."""
    return json.loads(PAGE_DATA.search(html).group(1))


def handmade() -> list[dict]:
    """Five questions, one per filter case (their flags in the comments)."""
    return [
        # right, after a search whose first passage holds the answer: no flag
        record("who played daisy duke in the 2005 film?",
               "<think>I should search.</think>\n<search> daisy duke 2005 film </search>"
               + observation(("The Dukes of Hazzard (film)", "Jessica Simpson played Daisy Duke."),
                             ("Catherine Bach", "Catherine Bach played Daisy in the series."))
               + "<think>Found it.</think>\n<answer> Jessica Simpson </answer>", ["Jessica Simpson"], 1.0, 1),
        # wrong although a passage holds the answer: wrong, in passages not given
        record("what is the capital of france?",
               "<think>Search.</think>\n<search> capital of france </search>"
               + observation(("France", "Its capital, Paris, is on the Seine."))
               + "<think>Lyon.</think>\n<answer> Lyon </answer>", ["Paris"], 0.0, 1),
        # wrong, answered without searching: wrong, no search
        record("who wrote hamlet?", "<think>I know it.</think>\n<answer> Marlowe </answer>", ["Shakespeare"], 0.0, 0),
        # right, but after text outside the tags and an invalid action: no search, malformed
        record("how many legs does a spider have?",
               "Spiders have eight legs </search>" + INVALID_ACTION_MESSAGE + "<think>Eight.</think>\n<answer> 8 </answer>",
               ["8", "eight"], 1.0, 0),
        # wrong; a passage, the question and the answer try to run code: wrong, in passages not given
        record("</script><script>window.pwned = 'question'</script> who?",
               "<think>Search.</think>\n<search> <b>bold</b> query </search>"
               + observation(("<script>window.pwned = 'title'</script>", "<script>window.pwned = 'passage'; alert(1)</script>"
                              " <img src=x onerror=\"window.pwned = 'img'\"> the gold answer"))
               + "<think>x</think>\n<answer> <i>nothing</i> </answer>", ["gold answer"], 0.0, 1,
               source="<i>custom</i>"),
    ]
