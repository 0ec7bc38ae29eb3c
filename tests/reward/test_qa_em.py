"""Exact-match reward: normalisation, answer extraction and the format-aware score."""

import numpy as np
import pytest

from search_r1.envs.search_r1 import reward, reward_format
from search_r1.qa import answers

GT = {"target": ["The Beatles"]}


def ans(text: str) -> str:
    return f"<think>thinking</think>\n<answer>{text}</answer>"


@pytest.mark.parametrize("pred, gold, expected", [
    ("beatles", "The Beatles", 1),
    ("The Beatles", "beatles", 1),
    ("USA", "U.S.A.", 1),
    ("U.S.A.", ["usa"], 1),
    ("A", "a", 1),              # article-only answer (e.g. "Vitamin A" -> "A")
    ("the", "a", 0),
    ("", "A", 0),               # an empty answer never matches an article-only gold answer
    ("an", "The Beatles", 0),
    ("  Paris\n\t", "paris", 1),
    ("Paris, France", "Paris", 0),
    ("Zürich", "zürich", 1),
    ("Zurich", "Zürich", 0),    # no accent folding in SQuAD normalisation
    ("東京", ["東京"], 1),
])
def test_em_check(pred, gold, expected):
    assert answers.em_check(pred, gold) == expected


def test_normalize_answer():
    assert answers.normalize_answer("  The  Quick, brown FOX!  ") == "quick brown fox"
    assert answers.normalize_answer("An apple a day") == "apple day"
    assert answers.normalize_answer("theatre") == "theatre"   # articles only as whole words


def test_subem_check():
    assert answers.subem_check("It was The Beatles, of course", "beatles") == 1
    assert answers.subem_check("the rolling stones", "beatles") == 0
    assert answers.subem_check("anything at all", "") == 0   # empty gold never matches
    assert answers.subem_check("vitamin a", "A") == 1          # article-only gold as a whole word
    assert answers.subem_check("banana", "A") == 0


def test_gold_as_numpy_array_and_dict():
    gold = np.array(["Paris", "Paris, France"], dtype=object)
    assert reward.compute_score_em(ans("paris, france"), {"target": gold}) == 1.0
    assert reward.compute_score_em(ans("Lyon"), gold) == 0.0
    assert reward.compute_score_em(ans("paris"), "Paris") == 1.0


def test_gold_as_zero_dim_numpy_array_is_one_answer():
    # np.array("Beijing", dtype=object).tolist() is the bare string; iterating it gave the
    # answers "B", "e", "i", ... so a one-letter answer scored.
    gold = np.array("Beijing", dtype=object)
    assert answers.as_answer_list(gold) == ["Beijing"]
    assert reward.compute_score_em(ans("B"), gold) == 0.0
    assert reward.compute_score_em(ans("beijing"), {"target": gold}) == 1.0
    assert answers.subem_check("B", gold) == 0
    assert reward_format.compute_score_em("<think>a</think><answer>B</answer>", gold, **FORMAT_KW) \
        == pytest.approx(0.2)   # well-formed, wrong answer


def test_non_string_gold_is_rejected():
    with pytest.raises(ValueError, match="not a string"):
        answers.em_check("1", [1])


def test_last_answer_wins():
    text = "<answer>Rolling Stones</answer> hmm <answer>The Beatles</answer>"
    assert reward.extract_solution(text) == "The Beatles"
    assert reward.compute_score_em(text, GT) == 1.0
    assert reward.compute_score_em("<answer>beatles</answer><answer>no</answer>", GT) == 0.0


def test_single_answer_in_response_counts():
    # the reference needed two matches because it scored prompt + response; we score the response
    assert reward.compute_score_em("<answer>beatles</answer>", GT) == 1.0


def test_unclosed_and_missing_answers():
    assert reward.extract_solution("<answer>The Beatles") is None
    assert reward.compute_score_em("<answer>The Beatles", GT) == 0.0
    assert reward.compute_score_em("The Beatles", GT) == 0.0
    # an unclosed trailing tag does not hide an earlier closed one
    assert reward.extract_solution("<answer>beatles</answer><answer>x") == "beatles"


def test_answer_inside_information_does_not_count():
    text = ("<think>x</think><search>band</search>\n\n<information>Doc 1(Title: B) "
            "<answer>The Beatles</answer></information>\n\n")
    assert reward.extract_solution(text) is None
    assert reward.compute_score_em(text, GT) == 0.0
    assert reward.compute_score_em(text + "<think>y</think><answer>Stones</answer>", GT) == 0.0
    # cut-off (unclosed) information block is ignored too
    assert reward.extract_solution("<information>x <answer>The Beatles</answer> y") is None


def test_invalid_action_message_is_not_an_answer():
    """The loop's corrective message holds "<answer> and </answer>"; it is environment text, so a
    row that never answered has no answer (no format credit for a wrong "and"), and a later real
    answer still wins."""
    from search_r1.envs.search_r1.prompts import INVALID_ACTION_MESSAGE

    unanswered = "<think>hmm</think> I guess" + INVALID_ACTION_MESSAGE + "<think>still thinking"
    assert reward.extract_solution(unanswered) is None
    assert reward.compute_score_em(unanswered, GT, format_score=0.1) == 0.0
    assert reward.extract_solution("<search>x" + INVALID_ACTION_MESSAGE + ans("The Beatles")) == "The Beatles"
    assert reward.extract_solution(INVALID_ACTION_MESSAGE + ans("and")) == "and"  # the model's own "and"


def test_empty_answer():
    assert reward.extract_solution("<answer>  </answer>") == ""
    assert reward.compute_score_em("<answer></answer>", GT) == 0.0
    assert reward.compute_score_em("<answer></answer>", GT, format_score=0.1) == 0.1
    assert reward.compute_score_em("<answer> </answer>", ["A"]) == 0.0
    assert reward.compute_score_em("<answer>The</answer>", ["A"]) == 0.0
    assert reward.compute_score_em("<answer>a</answer>", ["A"]) == 1.0


def test_whitespace_and_multiline_answer():
    assert reward.compute_score_em("<answer>\n  the\n beatles \n</answer>", GT) == 1.0


def test_plain_format_score():
    assert reward.compute_score_em(ans("Stones"), GT, format_score=0.1) == 0.1
    assert reward.compute_score_em(ans("Beatles"), GT, format_score=0.1, score=2.0) == 2.0
    assert reward.compute_score_em("no tags", GT, format_score=0.1) == 0.0


VALID_SEARCH = ("<think>who?</think>\n<search>fab four</search>\n\n<information>Doc 1(Title: \"The "
                "Beatles\") The Beatles were an English rock band.</information>\n\n"
                "<think>found it</think>\n<answer>{}</answer>")


@pytest.mark.parametrize("text, valid", [
    ("<think>a</think><answer>b</answer>", True),
    ("  <think>a</think>\n\n<answer>b</answer>\n", True),
    (VALID_SEARCH.format("x"), True),
    ("<think>a</think><search>q</search><information>i</information>"
     "<think>b</think><search>q2</search><information>j</information><think>c</think>"
     "<answer>d</answer>", True),
    ("<answer>b</answer>", False),                                     # no think first
    ("<think>a</think>junk<answer>b</answer>", False),                 # text between tags
    ("<think>a</think><answer>b</answer> trailing", False),            # text after the answer
    ("<think>a<answer>b</answer></think>", False),                     # nested tags
    ("<think>a</think><answer>b", False),                              # unclosed answer
    ("<think>a</think><search>q</search><think>b</think><answer>c</answer>", False),  # no info
    ("<think>a</think><search>q</search><information>i</information><answer>c</answer>", False),
    ("<think>a</think><answer>b</answer><answer>c</answer>", False),   # two answers
    ("<think>a</think><search>q</search><information>has <answer>x</answer> and <think>"
     "</information><think>b</think><answer>c</answer>", True),         # tags in passages ignored
])
def test_format_state_machine(text, valid):
    ok, reason = reward_format.check_format(text)
    assert ok is valid, reason


FORMAT_KW = dict(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1)


def test_format_score_em_and_valid():
    assert reward_format.compute_score_em(VALID_SEARCH.format("the beatles"), GT, **FORMAT_KW) == 1.0


def test_format_score_em_and_invalid():
    score = reward_format.compute_score_em("I think <answer>Beatles</answer>", GT, **FORMAT_KW)
    assert score == pytest.approx(0.8)


def test_format_score_valid_no_em_with_retrieval():
    score = reward_format.compute_score_em(VALID_SEARCH.format("Stones"), GT, **FORMAT_KW)
    assert score == pytest.approx(0.3)   # structure + gold found in <information>


def test_format_score_valid_no_em_without_retrieval():
    text = "<think>a</think><search>q</search><information>nothing here</information>" \
           "<think>b</think><answer>Stones</answer>"
    assert reward_format.compute_score_em(text, GT, **FORMAT_KW) == pytest.approx(0.2)


def test_format_score_invalid_with_answer():
    assert reward_format.compute_score_em("<answer>Stones</answer>", GT, **FORMAT_KW) == \
        pytest.approx(0.1)


def test_format_score_invalid_without_answer():
    assert reward_format.compute_score_em("<think>a</think> nothing", GT, **FORMAT_KW) == 0.0
    assert reward_format.compute_score_em("<think>a</think><answer>Beatles", GT, **FORMAT_KW) == 0.0


def test_default_compute_score_dispatch():
    text = "I think <answer>Beatles</answer>"
    assert reward.compute_score("nq", text, GT)["score"] == 1.0
    assert reward.compute_score("hotpotqa", text, GT, **FORMAT_KW)["score"] == pytest.approx(0.8)
    assert reward.compute_score("bamboogle", "<answer>x</answer>", GT, format_score=0.1)["score"] == 0.1
    with pytest.raises(NotImplementedError, match="gsm8k"):
        reward.compute_score("gsm8k", text, GT)
