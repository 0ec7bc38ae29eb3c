"""Bootstrap confidence intervals for exact-match tables: per source, their average, differences.

Percentile bootstrap (Efron & Tibshirani 1993, ch. 13): resample the questions with replacement,
recompute the statistic, take the ``(1 - c) / 2`` and ``(1 + c) / 2`` quantiles of the resampled
values. The average over sources is Search-R1's Table 2 "Avg." (the mean of the per-source EMs,
each source weighted equally), resampled within each source (a stratified bootstrap), so its
interval reflects every source's own size. Differences between two evaluations resample paired
questions together (the same question in both, the usual paired bootstrap of Koehn 2004) and
otherwise resample the two sides independently.

Everything here is a pure function of its inputs and ``seed``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

NUM_RESAMPLES = 2000
CONFIDENCE = 0.95
_MAX_DRAWS_PER_CHUNK = 1 << 22  # indices drawn at once (bounds memory for large sources)


def _as_values(values, name: str = "values") -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size == 0:
        raise ValueError(f"{name}: no values to bootstrap")
    return array


def resampled_means(values, num_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of ``num_resamples`` resamples (with replacement, same size) of ``values``: (num_resamples,)."""
    values = _as_values(values)
    n = values.size
    out = np.empty(num_resamples, dtype=np.float64)
    chunk = max(1, _MAX_DRAWS_PER_CHUNK // n)
    for start in range(0, num_resamples, chunk):
        stop = min(num_resamples, start + chunk)
        out[start:stop] = values[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    return out


def percentile_interval(samples, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The central ``confidence`` interval of bootstrap samples (linear-interpolated quantiles).

    Raises:
        ValueError: ``confidence`` outside (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    low, high = np.quantile(np.asarray(samples, dtype=np.float64), [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def mean_interval(values, num_resamples: int = NUM_RESAMPLES, confidence: float = CONFIDENCE,
                  seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of the mean of ``values`` (e.g. one source's per-question EMs)."""
    return percentile_interval(resampled_means(values, num_resamples, np.random.default_rng(seed)), confidence)


def average_of_means(groups: Sequence) -> float:
    """Mean of the groups' means (Search-R1 Table 2's average over data sets)."""
    return float(np.mean([_as_values(g).mean() for g in groups]))


def average_interval(groups: Sequence, num_resamples: int = NUM_RESAMPLES, confidence: float = CONFIDENCE,
                     seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of :func:`average_of_means`, each group resampled on its own (stratified).

    Raises:
        ValueError: no groups, or an empty group.
    """
    if len(groups) == 0:
        raise ValueError("no groups to average")
    rng = np.random.default_rng(seed)
    samples = np.mean([resampled_means(g, num_resamples, rng) for g in groups], axis=0)
    return percentile_interval(samples, confidence)


def resampled_differences(a, b, paired: bool, num_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``mean(b*) - mean(a*)`` over resamples: (num_resamples,).

    Args:
        a, b: per-question values of the two evaluations; with ``paired`` the same questions in
            the same order (resampled together, as the differences ``b - a``).
    Raises:
        ValueError: ``paired`` with sides of different lengths.
    """
    a, b = _as_values(a, "a"), _as_values(b, "b")
    if paired:
        if a.size != b.size:
            raise ValueError(f"paired samples differ in length ({a.size} vs {b.size})")
        return resampled_means(b - a, num_resamples, rng)
    return resampled_means(b, num_resamples, rng) - resampled_means(a, num_resamples, rng)


def difference_interval(a, b, paired: bool, num_resamples: int = NUM_RESAMPLES, confidence: float = CONFIDENCE,
                        seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of ``mean(b) - mean(a)`` (see :func:`resampled_differences`)."""
    rng = np.random.default_rng(seed)
    return percentile_interval(resampled_differences(a, b, paired, num_resamples, rng), confidence)


def average_difference_interval(pairs: Sequence[tuple], num_resamples: int = NUM_RESAMPLES,
                                confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float]:
    """Interval of the difference of two Table-2 averages.

    Args:
        pairs: one ``(a, b, paired)`` per source; each source is resampled on its own (paired or
            not), and the per-source resampled differences are averaged.
    Raises:
        ValueError: no sources.
    """
    if len(pairs) == 0:
        raise ValueError("no sources to compare")
    rng = np.random.default_rng(seed)
    samples = np.mean([resampled_differences(a, b, paired, num_resamples, rng) for a, b, paired in pairs], axis=0)
    return percentile_interval(samples, confidence)
