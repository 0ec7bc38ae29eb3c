"""The sampling-cost benchmark's variants: each turns on one setting of the trainer's requests over the raw
baseline, all decode the same number of tokens, ``rollout`` is what the trainer's engine sends and each
``rollout-<setting>`` that request without one setting."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sampling_cost  # noqa: E402


def _one(params):
    return params[0] if isinstance(params, list) else params


def test_each_variant_turns_on_one_setting_over_raw():
    raw = sampling_cost.request_params("raw", 3, 64)
    assert (raw.temperature, raw.top_p, raw.seed, raw.detokenize, raw.stop, raw.logprobs) == (1.0, 1.0, None, False,
                                                                                           [], None)
    assert _one(sampling_cost.request_params("top_p", 3, 64)).top_p == 0.95
    seeded = sampling_cost.request_params("seeded", 3, 64)
    assert [p.seed for p in seeded] == [0, 1, 2]  # one seed a request, as the trainer's engine gives them
    assert _one(sampling_cost.request_params("detokenize", 3, 64)).detokenize
    stop = _one(sampling_cost.request_params("stop", 3, 64))
    assert stop.detokenize and stop.stop == ["</search>", "</answer>"] and stop.include_stop_str_in_output
    assert _one(sampling_cost.request_params("logprobs", 3, 64)).logprobs == 0
    for variant in sampling_cost.VARIANTS:  # the same work: every row decodes max_tokens tokens
        params = sampling_cost.request_params(variant, 3, 64)
        assert all(p.max_tokens == 64 and p.ignore_eos and p.temperature == 1.0
                   for p in (params if isinstance(params, list) else [params]))


def test_rollout_is_the_trainers_request(monkeypatch):
    from verl.workers.rollout import vllm_rollout

    monkeypatch.setattr(vllm_rollout, "_is_cpu_platform", lambda: False)  # the GPU's request keeps its seeds
    rollout = sampling_cost.request_params("rollout", 2, 64)
    first = rollout[0]
    assert [p.seed for p in rollout] == [0, 1] and first.top_p == 0.95 and first.logprobs == 0
    assert first.stop == ["</search>", "</answer>"] and first.detokenize and first.ignore_eos
    assert not first.extra_args  # log-prob tokens without their text, as the trainer's engine answers
    texts = sampling_cost.request_params("rollout+logprob_text", 2, 64)
    assert [p.seed for p in texts] == [0, 1] and _settings(texts[0]) == _settings(first)
    assert all(p.extra_args == {vllm_rollout.LOGPROB_TEXT: True} for p in texts)


def _settings(params):
    return {"top_p": params.top_p, "seeded": params.seed is not None, "detokenize": params.detokenize,
            "stop": (tuple(params.stop), params.include_stop_str_in_output), "logprobs": params.logprobs}


def test_each_leave_one_out_is_the_trainers_request_without_that_setting(monkeypatch):
    from verl.workers.rollout import vllm_rollout

    monkeypatch.setattr(vllm_rollout, "_is_cpu_platform", lambda: False)
    trainers = _one(sampling_cost.request_params("rollout", 2, 64))
    rollout = _settings(trainers)
    raw = _settings(sampling_cost.request_params("raw", 2, 64))
    for setting in sampling_cost.SETTINGS:
        params = sampling_cost.request_params(f"rollout-{setting}", 2, 64)
        first = _one(params)
        assert (first.max_tokens, first.ignore_eos, first.temperature, first.top_k) == (64, True, 1.0, trainers.top_k)
        changed = {k for k, v in _settings(first).items() if v != rollout[k]}
        # taking out detokenization takes out the stop strings, which need it
        assert changed == ({"detokenize", "stop"} if setting == "detokenize" else {setting}), setting
        assert all(_settings(first)[k] == raw[k] for k in changed)  # taken out = the raw baseline's value
    assert [p.seed for p in sampling_cost.request_params("rollout-top_p", 3, 64)] == [0, 1, 2]


def test_slowdown_is_raws_median_over_the_variants():
    runs = {"raw": [{"tokens_per_s": 100.0}, {"tokens_per_s": 300.0}], "top_p": [{"tokens_per_s": 50.0}]}
    out = sampling_cost.summarize(runs)
    assert out["raw"]["tokens_per_s"] == 200.0 and out["raw"]["tokens_per_s_range"] == [100.0, 300.0]
    assert out["top_p"]["slowdown"] == pytest.approx(4.0) and out["raw"]["slowdown"] == 1.0


def test_an_unknown_variant_is_refused():
    with pytest.raises(SystemExit):
        sampling_cost.parse_args(["--variants", "raw,nucleus"])
