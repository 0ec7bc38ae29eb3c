"""Action parsing: first complete tag pair wins; empty queries are invalid."""

from search_r1.envs.search_r1.parsing import parse_action


def test_search_then_answer_first_wins():
    action = parse_action("<think>x</think><search> who </search><answer>Paris</answer>")
    assert (action.kind, action.content) == ("search", "who")


def test_answer_before_search_first_wins():
    action = parse_action("<answer> Paris </answer><search>q</search>")
    assert (action.kind, action.content) == ("answer", "Paris")


def test_unclosed_tags_are_invalid():
    assert parse_action("<search>capital of france").kind is None
    assert parse_action("<answer>Paris</search>").kind is None
    assert parse_action("</search>").kind is None


def test_empty_search_is_invalid():
    assert parse_action("<search>   </search>").kind is None
    assert not parse_action("<search></search>").valid


def test_multiline_query():
    action = parse_action("<search>capital\nof France\n</search>")
    assert (action.kind, action.content) == ("search", "capital\nof France")


def test_reasoning_blocks_and_the_text_outside_them():
    from search_r1.envs.search_r1.parsing import split_reasoning

    assert split_reasoning("<think> a\nb </think>\n") == (["a\nb"], "")
    assert split_reasoning("x <think>a</think> y <think>b</think>") == (["a", "b"], "x   y")
    assert split_reasoning("<think>never closed") == ([], "<think>never closed")


def test_parse_passages_inverts_format_passages_on_the_example_corpus():
    import json
    from pathlib import Path

    from search_r1.envs.search_r1.prompts import format_observation
    from search_r1.search.passages import format_passages, parse_passages, split_contents

    corpus = [json.loads(line) for line in (Path(__file__).resolve().parents[2] / "example" / "corpus.jsonl").open()]
    for start in range(0, len(corpus), 3):
        docs = [{"document": doc} for doc in corpus[start:start + 3]]
        block = format_observation(format_passages(docs)).strip()
        block = block.removeprefix("<information>").removesuffix("</information>")
        expected = [(rank, *split_contents(d["document"]["contents"])) for rank, d in enumerate(docs, start=1)]
        expected[-1] = (*expected[-1][:2], expected[-1][2].rstrip())  # the block is stripped
        assert parse_passages(block) == expected


def test_parse_passages_of_cut_and_empty_blocks():
    from search_r1.search.passages import parse_passages

    assert parse_passages("") == [] and parse_passages("no documents here") == []
    text = 'Doc 1(Title: "A (b)") one Doc 2(Title: x) inside\nDoc 2(Title: "T") two\nDoc 3(Title: "Cut'
    assert parse_passages(text) == [(1, '"A (b)"', "one Doc 2(Title: x) inside"), (2, '"T"', "two"), (3, '"Cut', "")]
