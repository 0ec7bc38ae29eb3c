"""SFT demonstrations: training questions only, RL prompt and tag format, real retrieved passages."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from search_r1.envs.search_r1.prompts import format_observation, make_prefix
from search_r1.search.passages import format_passages
from search_r1.envs.search_r1.prompts import ENVIRONMENT_TEXT
from verl.utils.dataset.sft_dataset import split_assistant_content

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import make_sft_data  # noqa: E402


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos")
    stats = make_sft_data.main(["--output_dir", str(out), "--num_demos", "40", "--num_val", "8"])
    rows = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    return stats, rows


def test_no_test_or_dev_question(demos):
    stats, rows = demos
    held_out = make_sft_data.held_out_questions([ROOT / "example" / "qa"])
    assert stats["train"] == 40 and stats["val"] == 8 and len(rows) == 40
    for row in rows:
        question = row["messages"][0]["content"].split("Question: ")[-1]
        assert make_sft_data.normalize_text(question) not in held_out


def test_format_matches_rl_stage(demos):
    _, rows = demos
    retriever = make_sft_data.InProcessBM25(str(ROOT / "example" / "corpus.jsonl"), topk=3)
    for row in rows[:5]:
        user, assistant = row["messages"]
        question = user["content"].split("Question: ")[-1].strip()
        assert user["content"] == make_prefix(question)
        segments = split_assistant_content(assistant["content"], ENVIRONMENT_TEXT)
        assert [s.trainable for s in segments] == [True, False, True]
        first, observation, last = (s.text for s in segments)
        query = re.fullmatch(r"<think> .+ </think>\n<search> (.+) </search>", first).group(1)
        assert observation == format_observation(format_passages(retriever.retrieve([query])[0]))
        answer = re.fullmatch(r"<think> .+ </think>\n<answer> (.+) </answer>", last).group(1)
        assert answer in row["golden_answers"]


def test_train_question_equal_to_a_test_question_is_refused(tmp_path):
    _write(tmp_path / "qa" / "nq" / "train.jsonl", [
        {"id": "a", "question": "Who wrote Hamlet", "golden_answers": ["Shakespeare"]},
        {"id": "b", "question": "What is the capital of France?", "golden_answers": ["Paris"]}])
    _write(tmp_path / "qa" / "nq" / "test.jsonl", [
        {"id": "t", "question": "who wrote  hamlet?", "golden_answers": ["Shakespeare"]}])
    held_out = make_sft_data.held_out_questions([tmp_path / "qa"])
    kept = make_sft_data.training_questions(tmp_path / "qa", held_out)
    assert [r["id"] for r in kept] == ["b"]


def test_cut_observation_is_what_the_rl_stage_shows(tiny_tokenizer):
    """With a tokenizer and max_obs_length, the <information> block is the Search-R1 environment's own
    observation (cut inside the passages, wrapper kept), decoded."""
    from search_r1.envs.search_r1 import SearchR1Environment
    from search_r1.envs.search_tool import SearchTool

    retriever = make_sft_data.InProcessBM25(str(ROOT / "example" / "corpus.jsonl"), topk=3)
    rows = make_sft_data.training_questions(ROOT / "example" / "qa", set())[:6]
    observe = make_sft_data.ObservationText(tiny_tokenizer, 64)
    demos = make_sft_data.build_demonstrations(rows, retriever, 6, seed=0, observe=observe)
    env = SearchR1Environment(tiny_tokenizer, SearchTool(None), 64)
    for demo in demos:
        content = demo["messages"][1]["content"]
        first, observation, last = (s.text for s in split_assistant_content(content, ENVIRONMENT_TEXT))
        query = re.fullmatch(r"<think> .+ </think>\n<search> (.+) </search>", first).group(1)
        rendered = env.render(retriever.retrieve([query])[0])
        assert rendered.counts["obs_truncated"] and observation == tiny_tokenizer.decode(rendered.ids)
        assert observation.endswith("</information>\n\n") and len(tiny_tokenizer.encode(observation)) <= 66
        # The second think states the answer and is not a copy of the first (v1's failure mode).
        answer = re.fullmatch(r"<think> (.+) </think>\n<answer> (.+) </answer>", last)
        assert answer.group(2) in answer.group(1) and answer.group(1) not in make_sft_data.FIRST_THOUGHTS


def test_max_obs_length_without_tokenizer_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--tokenizer"):
        make_sft_data.main(["--output_dir", str(tmp_path), "--num_demos", "2", "--num_val", "1",
                            "--max_obs_length", "64"])
