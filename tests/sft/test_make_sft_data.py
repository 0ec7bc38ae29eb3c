"""SFT demonstrations: training questions only, RL prompt and tag format, real retrieved passages."""

from __future__ import annotations

import hashlib
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


# sha256 of train.jsonl + val.jsonl of the `demos` fixture (the default recipe: one search, seed 0, 40 + 8
# demos over example/). The default is what the cached warm start (warm_start.WARM_START_NAME) was
# trained on: an intended change is a new recipe, so bump that name along with this digest.
DEFAULT_DEMOS_SHA256 = "69dc28a56fccc58d70b4921d9619ddcb6d338d3946ac06640d4e4bc4ff28efcf"


def test_default_demos_unchanged(demos):
    stats, _ = demos
    out = Path(stats["output_dir"])
    digest = hashlib.sha256((out / "train.jsonl").read_bytes() + (out / "val.jsonl").read_bytes()).hexdigest()
    assert digest == DEFAULT_DEMOS_SHA256 and stats["by_searches"] == {1: 48}


@pytest.fixture(scope="module")
def retriever():
    return make_sft_data.InProcessBM25(str(ROOT / "example" / "corpus.jsonl"), topk=3)


@pytest.fixture(scope="module")
def two_hop_demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_hop_demos")
    stats = make_sft_data.main(["--output_dir", str(out), "--num_demos", "40", "--num_val", "8",
                                "--multi_hop_searches", "2"])
    rows = [json.loads(x) for name in ("train", "val") for x in (out / f"{name}.jsonl").read_text().splitlines()]
    return stats, rows


def _turns(content: str) -> tuple[list[tuple[str, str]], list[str], tuple[str, str]]:
    """(think, query) of each search, the observations, and the final (think, answer)."""
    segments = split_assistant_content(content, ENVIRONMENT_TEXT)
    assert [s.trainable for s in segments] == [True, False] * (len(segments) // 2) + [True]
    texts = [s.text for s in segments]
    searches = [re.fullmatch(r"<think> (.+) </think>\n<search> (.+) </search>", t).groups() for t in texts[:-1:2]]
    final = re.fullmatch(r"<think> (.+) </think>\n<answer> (.+) </answer>", texts[-1]).groups()
    return searches, texts[1::2], final


def test_two_hop_mix_is_half_multi_hop_with_two_searches(two_hop_demos):
    stats, rows = two_hop_demos
    kinds = {(row["data_source"] in make_sft_data.MULTI_HOP_SOURCES,
              row["messages"][1]["content"].count("<search>"),
              row["messages"][1]["content"].count("<information>")) for row in rows}
    assert kinds == {(True, 2, 2), (False, 1, 1)}
    assert stats["by_searches"] == {1: 24, 2: 24} and stats["train"] == 40 and len(rows) == 48
    held_out = make_sft_data.held_out_questions([ROOT / "example" / "qa"])
    for row in rows:
        question = row["messages"][0]["content"].split("Question: ")[-1]
        assert make_sft_data.normalize_text(question) not in held_out


def test_two_hop_format_matches_rl_stage(two_hop_demos, retriever):
    """Every observation is the generation manager's rendering of what its query retrieves; the second
    query is the bridge passage's title and differs from the first; the thinks differ in kind."""
    _, rows = two_hop_demos
    train = {r["id"]: r for r in make_sft_data.training_questions(ROOT / "example" / "qa", set())}
    passages = make_sft_data.load_passages(str(ROOT / "example" / "corpus.jsonl"),
                                           {pid for r in train.values() for pid in r.get("gold_passage_ids") or []})
    for row in rows:
        user, assistant = row["messages"]
        question = user["content"].split("Question: ")[-1].strip()
        assert user["content"] == make_prefix(question)
        searches, observations, (final, answer) = _turns(assistant["content"])
        for (_, query), observation in zip(searches, observations):
            assert observation == format_observation(format_passages(retriever.retrieve([query])[0]))
        assert searches[0] == (searches[0][0], make_sft_data.search_query(question))
        assert searches[0][0] in make_sft_data.FIRST_THOUGHTS and answer in row["golden_answers"]
        assert answer in final and final not in make_sft_data.FIRST_THOUGHTS
        if row["data_source"] in make_sft_data.MULTI_HOP_SOURCES:
            (_, first), (middle, second) = searches
            bridges = {make_sft_data.passage_title(passages[pid]) for pid in train[row["id"]]["gold_passage_ids"]}
            assert second != first and any(second.startswith(b) and b in middle for b in bridges)
            finals = [t.format(answer=answer) for t in make_sft_data.FINAL_THOUGHTS]
            assert middle not in make_sft_data.FIRST_THOUGHTS + finals
            # Preferred rows: the second search was needed (answer absent from the first observation) and found it.
            assert row["answer_in_passages"] and not make_sft_data.contains_answer(row, observations[0])


def test_two_hop_cut_observations_are_what_the_rl_stage_shows(tiny_tokenizer, retriever):
    from search_r1.envs.search_r1 import SearchR1Environment
    from search_r1.envs.search_tool import SearchTool

    rows = make_sft_data.training_questions(ROOT / "example" / "qa", set())
    rows = [r for r in rows if r["data_source"] == "hotpotqa"][:4] + [r for r in rows if r["data_source"] == "nq"][:4]
    passages = make_sft_data.load_passages(str(ROOT / "example" / "corpus.jsonl"),
                                           {pid for r in rows for pid in r.get("gold_passage_ids") or []})
    demos = make_sft_data.build_mixed_demonstrations(rows, retriever, 8, 0, passages,
                                                     observe=make_sft_data.ObservationText(tiny_tokenizer, 64))
    env = SearchR1Environment(tiny_tokenizer, SearchTool(None), 64)
    assert sorted(d["messages"][1]["content"].count("<search>") for d in demos) == [1] * 4 + [2] * 4
    for demo in demos:
        searches, observations, _ = _turns(demo["messages"][1]["content"])
        for (_, query), observation in zip(searches, observations):
            assert observation == tiny_tokenizer.decode(env.render(retriever.retrieve([query])[0]).ids)


def test_two_hop_warm_start_is_cached_under_its_own_name():
    import warm_start

    assert warm_start.warm_start_name() == warm_start.WARM_START_NAME == "smollm2-135m-search-sft-v2"
    assert warm_start.warm_start_name(2) == "smollm2-135m-search-sft-v2-2hop"
    assert warm_start.warm_start_dir(2).name == "smollm2-135m-search-sft-v2-2hop"
    assert warm_start.warm_start_dir().name == warm_start.WARM_START_NAME


def test_max_obs_length_without_tokenizer_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--tokenizer"):
        make_sft_data.main(["--output_dir", str(tmp_path), "--num_demos", "2", "--num_val", "1",
                            "--max_obs_length", "64"])
