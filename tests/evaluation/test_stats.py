"""The bootstrap intervals against plain-Python references and the normal approximation."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from verl.trainer.evaluation import stats


def _reference_percentile(samples: list[float], q: float) -> float:
    """numpy's default (linear) quantile, written out."""
    ordered = sorted(samples)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _reference_interval(draw, num_resamples: int, seed: int, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap with Python's own RNG: ``draw(rng)`` is one resampled statistic."""
    rng = random.Random(seed)
    samples = [draw(rng) for _ in range(num_resamples)]
    return (_reference_percentile(samples, (1 - confidence) / 2), _reference_percentile(samples, (1 + confidence) / 2))


def _resample_mean(values, rng) -> float:
    return sum(rng.choice(values) for _ in values) / len(values)


def _bernoulli(n: int, p: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [1.0 if rng.random() < p else 0.0 for _ in range(n)]


def test_percentile_interval_is_the_linear_quantile():
    samples = [0.3, 0.1, 0.7, 0.5, 0.9, 0.2, 0.4]
    assert stats.percentile_interval(samples, 0.5) == pytest.approx(
        (_reference_percentile(samples, 0.25), _reference_percentile(samples, 0.75)))
    with pytest.raises(ValueError, match="confidence"):
        stats.percentile_interval(samples, 1.0)


def test_constant_values_give_a_point_interval():
    assert stats.mean_interval([1.0] * 7) == (1.0, 1.0)
    assert stats.mean_interval([0.0]) == (0.0, 0.0)
    assert stats.average_interval([[1.0, 1.0], [0.0]]) == (0.5, 0.5)


def test_mean_interval_matches_a_plain_python_bootstrap_and_the_normal_approximation():
    values = _bernoulli(300, 0.3, seed=1)
    p, n = float(np.mean(values)), len(values)
    low, high = stats.mean_interval(values, num_resamples=4000, seed=3)
    ref_low, ref_high = _reference_interval(lambda rng: _resample_mean(values, rng), 4000, seed=5)
    assert (low, high) == pytest.approx((ref_low, ref_high), abs=0.012)
    half = 1.96 * math.sqrt(p * (1 - p) / n)
    assert (low, high) == pytest.approx((p - half, p + half), abs=0.012)
    assert stats.mean_interval(values, num_resamples=4000, seed=3) == (low, high)  # seeded: reproducible


def test_large_sources_are_resampled_in_chunks():
    values = _bernoulli(50_000, 0.5, seed=2)  # 2000 x 50,000 draws: more than one chunk
    low, high = stats.mean_interval(values, num_resamples=200, seed=0)
    half = 1.96 * math.sqrt(0.25 / len(values))
    assert (low, high) == pytest.approx((np.mean(values) - half, np.mean(values) + half), abs=0.002)


def test_average_interval_is_a_stratified_bootstrap_of_the_mean_of_means():
    groups = [_bernoulli(200, 0.2, 1), _bernoulli(50, 0.6, 2), _bernoulli(120, 0.4, 3)]
    assert stats.average_of_means(groups) == pytest.approx(np.mean([np.mean(g) for g in groups]))
    low, high = stats.average_interval(groups, num_resamples=4000, seed=1)
    ref = _reference_interval(lambda rng: sum(_resample_mean(g, rng) for g in groups) / len(groups), 4000, seed=2)
    assert (low, high) == pytest.approx(ref, abs=0.012)
    means = [np.mean(g) for g in groups]
    half = 1.96 * math.sqrt(sum(m * (1 - m) / len(g) for m, g in zip(means, groups))) / len(groups)
    assert (low, high) == pytest.approx((np.mean(means) - half, np.mean(means) + half), abs=0.012)


def test_paired_differences_resample_questions_together():
    a = _bernoulli(200, 0.4, 1)
    assert stats.difference_interval(a, a, paired=True) == (0.0, 0.0)
    b = list(a)
    for i in range(0, 40):  # 20 of the first 40 wrong answers become right: +0.1 at most
        if b[i] == 0.0:
            b[i] = 1.0
    gain = float(np.mean(b) - np.mean(a))
    paired = stats.difference_interval(a, b, paired=True, num_resamples=4000, seed=1)
    unpaired = stats.difference_interval(a, b, paired=False, num_resamples=4000, seed=1)
    assert paired[0] <= gain <= paired[1] and paired[0] > 0  # a strict gain on the same questions
    assert unpaired[1] - unpaired[0] > 2 * (paired[1] - paired[0])
    ref = _reference_interval(lambda rng: _resample_mean([y - x for x, y in zip(a, b)], rng), 4000, seed=2)
    assert paired == pytest.approx(ref, abs=0.01)
    pa, pb = np.mean(a), np.mean(b)
    half = 1.96 * math.sqrt(pa * (1 - pa) / len(a) + pb * (1 - pb) / len(b))
    assert unpaired == pytest.approx((gain - half, gain + half), abs=0.015)


def test_average_difference_mixes_paired_and_unpaired_sources():
    a1, b1 = _bernoulli(150, 0.3, 1), _bernoulli(150, 0.3, 1)  # identical: contributes exactly 0
    a2, b2 = _bernoulli(100, 0.2, 2), _bernoulli(80, 0.5, 3)
    low, high = stats.average_difference_interval([(a1, b1, True), (a2, b2, False)], num_resamples=4000, seed=0)
    only_second = stats.difference_interval(a2, b2, paired=False, num_resamples=4000, seed=7)
    assert (low, high) == pytest.approx((only_second[0] / 2, only_second[1] / 2), abs=0.012)


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="no values"):
        stats.mean_interval([])
    with pytest.raises(ValueError, match="differ in length"):
        stats.difference_interval([1.0, 0.0], [1.0], paired=True)
    with pytest.raises(ValueError, match="no groups"):
        stats.average_interval([])
