"""Action parsing: first complete tag pair wins; empty queries are invalid."""

from search_r1.llm_agent.parsing import parse_action


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
