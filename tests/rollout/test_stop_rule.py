"""A turn ends exactly at its stop string, with real tokenizers whose BPE merges ``>`` with what follows.

SmolLM2 merges ``><`` and ``>.``; Qwen2.5 ``>.`` and ``>\\n\\n``. The token that completes
``</search>``/``</answer>`` then carries more text; the rule (``verl/workers/rollout/agent_loop/stop_rule.py``)
drops that token and appends the rest of the stop string as environment tokens (mask 0).
"""

from __future__ import annotations

import pytest

from verl.workers.rollout.agent_loop.stop_rule import split_at_stop
from tests.rollout.scripted import ScriptedEngine, search_loop
from tests.rollout.test_generation_loop import PARAMS, make_batch
from verl.workers.rollout.base import first_stop

STOPS = ("</search>", "</answer>")
CASES = [  # (tokenizer fixture, first turn as the model writes it, the merged token that completes the stop)
    ("tokenizer", "<search> Manuel Díaz Rodríguez </search><think>", "><"),
    ("tokenizer", "<search>Manuel Díaz Rodríguez</search>.", ">."),
    ("qwen_tokenizer", "<search>Manuel Díaz Rodríguez</search>\n\nand more", ">\n\n"),
    ("qwen_tokenizer", "<search>Manuel Díaz Rodríguez</search>.", ">."),
]


def sampled_turn(tokenizer, text: str) -> list[int]:
    """The ids an engine returns for ``text``: up to the token that completes a stop string."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    for end in range(1, len(ids) + 1):
        if first_stop(tokenizer.decode(ids[:end]), STOPS):
            return ids[:end]
    raise AssertionError("no stop string")


@pytest.mark.parametrize("tokenizer_name,first_turn,merged", CASES)
def test_turn_ends_exactly_at_the_stop_string(tokenizer_name, first_turn, merged, request, retriever, mode):
    tokenizer = request.getfixturevalue(tokenizer_name)
    sampled = sampled_turn(tokenizer, first_turn)
    assert tokenizer.decode(sampled[-1:]) == merged, "the tokenizer no longer merges; the case is vacuous"
    prompts, batch = make_batch(tokenizer, ["q0"])
    engine = ScriptedEngine(tokenizer, prompts, [[first_turn, "<answer> Caracas </answer>."]])
    config = dict(max_turns=2, max_response_length=400, max_obs_length=200, mode=mode)
    out = search_loop(tokenizer, engine, retriever, **config).run(batch, PARAMS)

    real = out.batch["attention_mask"][0, -400:].bool()
    response = out.batch["responses"][0][real].tolist()
    mask = out.batch["response_mask"][0][real].tolist()
    log_probs = out.batch["rollout_log_probs"][0][real].tolist()
    first_obs = mask.index(0)
    # trained ids = sampled ids: the first turn keeps every sampled token but the merged one
    assert response[:first_obs] == sampled[:-1]
    # the text ends at the stop string, then the observation follows: no stray "<", "." or newline
    text = tokenizer.decode(response, skip_special_tokens=True)
    assert text.startswith(first_turn[:first_turn.index("</search>") + len("</search>")] + "\n\n<information>")
    assert "</answer>" in text and "</answer>." not in text and "</search>" + merged[1:] + "\n" not in text
    # the environment's ">" is untrained; every trained token carries the engine's log-prob
    assert all(lp == -0.5 for lp, m in zip(log_probs, mask) if m == 1)
    assert all(lp == 0.0 for lp, m in zip(log_probs, mask) if m == 0)
    # the ids trained on are the ids the model is conditioned on in the next turn
    second_context = [c for call in engine.calls for c in call][1]
    assert second_context == prompts[0] + response[:len(second_context) - len(prompts[0])]
    assert len(second_context) > len(prompts[0]) + first_obs
    assert out.batch["valid_search"].tolist() == [1] and out.batch["finished"].tolist() == [1]


def test_split_at_stop_keeps_clean_turns_and_cuts_merged_ones(tokenizer, qwen_tokenizer):
    clean = tokenizer.encode("<search> a </search>", add_special_tokens=False)
    assert split_at_stop(tokenizer, clean, STOPS) == (len(clean), [])
    assert split_at_stop(tokenizer, tokenizer.encode("no stop", add_special_tokens=False), STOPS) == (2, [])
    merged = sampled_turn(qwen_tokenizer, "<answer> Paris </answer>.")
    keep, tail = split_at_stop(qwen_tokenizer, merged, STOPS)
    assert keep == len(merged) - 1 and qwen_tokenizer.decode(merged[:keep] + tail) == "<answer> Paris </answer>"
