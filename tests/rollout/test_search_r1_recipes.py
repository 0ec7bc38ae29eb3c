"""The Search-R1 environment's recipe parts: templates re-rendered at load (fast, stated budget), the
F1 reward, and the text-level health signals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from search_r1.envs.search_r1.env import SearchR1Environment
from search_r1.envs.search_r1.health import broken_tags, distinct_ngram_ratio
from search_r1.envs.search_r1.prompts import TEMPLATES, make_prefix, prompt_messages, template_of
from verl.trainer.ppo.config import default_config
from verl.utils.config import ConfigError
from verl.utils.dataset.rl_dataset import RLHFDataset


def environment(tokenizer, **sections) -> SearchR1Environment:
    return SearchR1Environment.from_config(default_config(do_search=False, **sections), tokenizer)


def test_recipe_fast_template_drops_the_mandatory_think_and_budget_states_max_turns():
    fast = make_prefix("who wrote hamlet", "fast")
    assert "<think>" not in fast and "<search> query </search>" in fast and "<answer> Beijing </answer>" in fast
    assert "You can search as many times as you want." in fast
    budget = make_prefix("who wrote hamlet", "fast", search_budget=3)
    assert "You can search at most 3 times." in budget and "as many times" not in budget
    assert "at most 1 time." in make_prefix("q", "base", search_budget=1)
    for name in TEMPLATES:  # every template and its budgeted form read back as (template, question)
        assert template_of(make_prefix("who wrote hamlet", name)) == (name, "who wrote hamlet?")
        assert template_of(make_prefix("who wrote hamlet", name, 4)) == (name, "who wrote hamlet?")
    assert template_of("Question: who wrote hamlet?\n") is None
    with pytest.raises(ValueError, match="at least 1"):
        make_prefix("q", "base", search_budget=0)


def test_recipe_rows_are_rerendered_at_load_with_the_fast_template_and_budget(qwen_tokenizer, tmp_path):
    rows = [{"data_source": "nq", "prompt": prompt_messages(q, "base"), "reward_model": {"ground_truth": {"target": ["x"]}}}
            for q in ("who wrote hamlet", "what is the capital of peru")]
    pd.DataFrame(rows).to_parquet(tmp_path / "rows.parquet")
    cfg = default_config(do_search=False, max_turns=3, prompt={"template": "fast", "state_search_budget": True})
    env = SearchR1Environment.from_config(cfg, qwen_tokenizer)
    dataset = RLHFDataset(str(tmp_path / "rows.parquet"), qwen_tokenizer, cfg.data, env)
    assert [row["_messages"] for row in dataset.rows] == [
        [{"role": "user", "content": make_prefix("who wrote hamlet", "fast", 3)}],
        [{"role": "user", "content": make_prefix("what is the capital of peru", "fast", 3)}]]
    budget_only = environment(qwen_tokenizer, max_turns=2, prompt={"state_search_budget": True})
    kept = budget_only.prompt_messages({}, prompt_messages("q", "instruct"))
    assert kept == prompt_messages("q", "instruct", 2)  # the row's own template, budget stated
    as_written = environment(qwen_tokenizer)
    assert as_written.prompt_messages({}, [{"role": "user", "content": "free text"}]) == [
        {"role": "user", "content": "free text"}]
    with pytest.raises(ConfigError, match="not one user turn written with a Search-R1 template"):
        env.prompt_messages({}, [{"role": "user", "content": "free text"}])


def test_f1_reward_through_the_environment(qwen_tokenizer):
    env = environment(qwen_tokenizer, reward_model={"style": "f1", "no_answer_penalty": 0.1, "no_search_penalty": 0.1})
    gold = {"target": ["William Shakespeare"]}
    out = env.compute_score("nq", "<answer>Shakespeare</answer>", gold)
    assert out["score"] == pytest.approx(2 / 3 - 0.1) and out["f1"] == pytest.approx(2 / 3)
    assert out["cover_em"] == 0.0 and out["em"] == 0.0
    assert env.describe(default_config(reward_model={"style": "f1"}))["reward"] == "f1"


def test_health_signals_of_search_r1_text(qwen_tokenizer):
    env = environment(qwen_tokenizer)
    responses = [
        "<think>find it</think>\n<search> hamlet </search>\n\n<information>Doc 1(Title: <think>) x</information>\n\n"
        "<think>found</think>\n<answer> Shakespeare </answer>",          # well formed, 1 search
        "<think>the the the the the the",                                 # cut inside <think>, repeating
        "<think>a b</think><search> q <answer> x </answer>",             # <answer> inside an open <search>
        "<answer> x </answer></think>",                                   # a stray closing tag
    ]
    signals = env.health(responses)
    assert signals["broken_tags"].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert signals["no_answer"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert signals["searches"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert signals["think_words"].tolist() == [3.0, 6.0, 2.0, 0.0]
    assert signals["think_distinct_3gram"][1] == pytest.approx(1 / 4)  # "the the the" x4 -> 1 distinct
    assert np.isnan(signals["think_distinct_3gram"][2])                # fewer than 3 words
    assert set(env.health_rules) <= set(signals) and env.health_by_source == ("searches",)


def test_health_helpers():
    assert not broken_tags("no tags at all") and broken_tags("<search> q")
    assert not broken_tags("<think>x</think><search>q</search>")
    assert distinct_ngram_ratio("a b c a b c".split()) == pytest.approx(3 / 4)
