"""Token F1 and cover-EM of QA answers, and Search-R1++'s F1+ reward with its action penalties."""

import pytest

from search_r1.envs.search_r1 import reward
from search_r1.envs.search_r1.config import QARewardConfig
from search_r1.qa import answers
from verl.utils.config import ConfigError

GT = {"target": ["The Beatles", "Beatles band"]}
SEARCHED = "<think>who</think>\n<search> fab four </search>\n\n<information>Doc 1(Title: x) y</information>\n\n"


def f1_reference(prediction: str, gold: str) -> float:
    """SQuAD's official f1_score, written out: a bag-of-words precision/recall harmonic mean."""
    pred, truth = answers.normalize_answer(prediction).split(), answers.normalize_answer(gold).split()
    common = sum(min(pred.count(w), truth.count(w)) for w in set(pred))
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(truth)
    return 2 * precision * recall / (precision + recall)


@pytest.mark.parametrize("prediction", ["the beatles", "beatles", "The Beatles and the Stones", "Stones",
                                        "beatles beatles band", "band of the beatles"])
def test_f1_score_is_squad_token_f1_best_over_golds(prediction):
    expected = max(f1_reference(prediction, gold) for gold in GT["target"])
    assert answers.f1_score(prediction, GT) == pytest.approx(expected)


def test_f1_edge_cases():
    assert answers.f1_score("Paris", "paris") == 1.0
    assert answers.f1_score("paris france", "paris") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert answers.f1_score("", "paris") == 0.0
    assert answers.f1_score("A", "a") == 1.0                 # article-only answers keep their article
    assert answers.f1_score("the", "The Beatles") == 0.0


def test_cover_em_is_gold_contained_in_the_answer():
    assert answers.cover_em_check("It was The Beatles, of course", GT) == 1
    assert answers.cover_em_check("the beatle", GT) == 0
    assert answers.em_check("It was The Beatles, of course", GT) == 0


def test_f1_plus_penalises_missing_search_and_missing_answer():
    """F1+ = F1 - 0.1 [no search] - 0.1 [no answer] (Xu et al. 2026)."""
    kw = {"no_search_penalty": 0.1, "no_answer_penalty": 0.1}
    partial = answers.f1_score("beatles band members", GT)
    assert reward.compute_score_f1(SEARCHED + "<answer> beatles band members </answer>", GT, **kw) == pytest.approx(partial)
    assert reward.compute_score_f1("<answer> beatles band members </answer>", GT, **kw) == pytest.approx(partial - 0.1)
    assert reward.compute_score_f1(SEARCHED + "<think>unsure</think>", GT, **kw) == pytest.approx(-0.1)
    assert reward.compute_score_f1("<think>unsure</think>", GT, **kw) == pytest.approx(-0.2)
    # plain F1: answering wrongly and not answering score the same (the answer-avoidance trap)
    assert reward.compute_score_f1("<answer>stones</answer>", GT) == reward.compute_score_f1("nothing", GT) == 0.0
    # a search written by the loop's own text (an <information> block) is not the model's
    assert reward.compute_score_f1("<information><search>x</search></information><answer>the beatles</answer>",
                                   GT, **kw) == pytest.approx(0.9)


def test_f1_style_scores_and_reports_em_f1_cover_em_retrieved():
    env_cfg = QARewardConfig(style="f1", no_answer_penalty=0.1, no_search_penalty=0.1)
    out = reward.compute_score("nq", "<answer>It was The Beatles</answer>", GT, **env_cfg.score_kwargs())
    f1 = answers.f1_score("It was The Beatles", GT)
    assert out == {"score": pytest.approx(f1 - 0.1), "em": 0.0, "f1": pytest.approx(f1), "cover_em": 1.0,
                   "retrieved": 0.0}
    em_out = reward.compute_score("nq", SEARCHED + "<answer>beatles</answer>", GT, **QARewardConfig().score_kwargs())
    assert em_out == {"score": 1.0, "em": 1.0, "f1": 1.0, "cover_em": 1.0, "retrieved": 0.0}
    # retrieved: a gold answer in an observation, whatever the answer says (a reading miss)
    found = "<search>q</search><information>Doc 1(Title: Band) The Beatles were a band.</information><answer>x</answer>"
    assert reward.compute_score("nq", found, GT)["retrieved"] == 1.0
    assert reward.compute_score("nq", "<answer>The Beatles</answer>", GT)["retrieved"] == 0.0


def test_f1_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="no_answer_penalty=0.1 applies to the f1 reward only"):
        QARewardConfig(no_answer_penalty=0.1)
    with pytest.raises(ConfigError, match="structure_format_score: format scores do not combine"):
        QARewardConfig(style="f1", structure_format_score=0.2)
    with pytest.raises(ConfigError, match="not one of em, format, f1"):
        QARewardConfig(style="f2")

