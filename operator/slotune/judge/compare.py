"""A/B verification for the tuner: is a latency percentile better (or worse) in window B than in window A?

Method: a two-sample quantile test (Mood's median test generalized to any quantile; Conover, Practical
Nonparametric Statistics, 3rd ed., section 4.3). Pool both windows, take the pooled q-quantile as a threshold,
count the observations above it in each window, and test the 2x2 table with a one-sided Fisher exact test. If A and
B come from one distribution, which pooled observations landed in B is a random draw (the threshold is a symmetric
function of the pool), so the count above it in B is hypergeometric and the false-positive rate is at most alpha,
whatever the latency distribution. Histograms work the same way with the threshold on a bucket boundary, which is
why the operator can run it on Prometheus bucket increases. Ties at the threshold count as "not above", which only
makes the test more conservative.

Effect size: the ratio of the two windows' percentiles (interpolated as histogram_quantile does for histograms).
A verdict needs both significance and at least `min_relative_change` of effect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from scipy import special

from slotune.snapshot import Histogram

METHOD = "quantile test: pooled-quantile threshold, one-sided Fisher exact test on exceedance counts"


class Difference(StrEnum):
    """What the test finds between two windows (not a tuning iteration's verdict, which is `slotune.api.Verdict`)."""

    BETTER = "better"  # B's percentile is lower (faster) than A's, beyond noise and tolerance
    WORSE = "worse"
    NO_CHANGE = "no-change"  # not distinguishable at this alpha and tolerance
    TOO_FEW_SAMPLES = "too-few-samples"


@dataclass(frozen=True)
class Comparison:
    percentile: float
    a_ms: float | None
    b_ms: float | None
    ratio: float | None  # b / a: below 1 is faster
    p_better: float  # p-value of "B is faster at this percentile"
    p_worse: float
    alpha: float
    verdict: Difference
    method: str = METHOD

    @property
    def confidence_better(self) -> float:
        return 1.0 - self.p_better


@dataclass(frozen=True)
class _Exceedances:
    above_a: int
    total_a: int
    above_b: int
    total_b: int


def _fisher_one_sided(counts: _Exceedances) -> tuple[float, float]:
    """(p that B exceeds less often than A, p that B exceeds more often): one-sided Fisher exact tests.

    Given the margins, B's count above the threshold is hypergeometric (population A+B, successes = all above,
    draws = B's size), so the one-sided p-values are its CDF and survival function (scipy's fisher_exact computes
    the same, slower).
    """
    population, above, draws = counts.total_a + counts.total_b, counts.above_a + counts.above_b, counts.total_b
    support = np.arange(max(0, draws + above - population), min(above, draws) + 1)
    log_pmf = _log_choose(above, support) + _log_choose(population - above, draws - support)
    pmf = np.exp(log_pmf - _log_choose(population, draws))
    at_most = float(pmf[support <= counts.above_b].sum())
    at_least = float(pmf[support >= counts.above_b].sum())
    return min(1.0, at_most), min(1.0, at_least)


def _log_choose(n: int | np.ndarray, k: int | np.ndarray) -> np.ndarray:
    return special.gammaln(np.add(n, 1)) - special.gammaln(np.add(k, 1)) - special.gammaln(np.subtract(n, k) + 1)


def _verdict(p_better: float, p_worse: float, ratio: float | None, alpha: float, min_relative_change: float
             ) -> Difference:
    if ratio is None:
        return Difference.TOO_FEW_SAMPLES
    if p_better < alpha and ratio <= 1 - min_relative_change:
        return Difference.BETTER
    if p_worse < alpha and ratio >= 1 + min_relative_change:
        return Difference.WORSE
    return Difference.NO_CHANGE


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a <= 0:
        return None
    return b / a


def compare_samples(a_ms: Sequence[float] | np.ndarray, b_ms: Sequence[float] | np.ndarray, percentile: float,
                    alpha: float = 0.05, min_relative_change: float = 0.0) -> Comparison:
    """Is `percentile` (0-100) of B's samples lower than A's? Lower latency is better."""
    a, b = np.asarray(a_ms, dtype=float), np.asarray(b_ms, dtype=float)
    if a.size == 0 or b.size == 0:
        return Comparison(percentile, None, None, None, 1.0, 1.0, alpha, Difference.TOO_FEW_SAMPLES)
    threshold = np.percentile(np.concatenate([a, b]), percentile, method="lower")
    counts = _Exceedances(int((a > threshold).sum()), a.size, int((b > threshold).sum()), b.size)
    p_better, p_worse = _fisher_one_sided(counts)
    a_value, b_value = float(np.percentile(a, percentile)), float(np.percentile(b, percentile))
    ratio = _ratio(a_value, b_value)
    return Comparison(percentile, a_value, b_value, ratio, p_better, p_worse, alpha,
                      _verdict(p_better, p_worse, ratio, alpha, min_relative_change))


def _pooled_boundary(a: Histogram, b: Histogram, q: float) -> int:
    """The threshold for exceedance: requests in buckets after this index exceed it. The pooled q-quantile falls in
    one bucket, whose requests tie: its upper edge counts them below, its lower edge above. The edge taken is the
    one whose pooled share above is nearer 1 - q. Always the upper edge made the test blind when one arm's whole mass
    sits in the quantile's bucket: siblings all in (1, 2.5] s and a canary all under 20 ms put the pooled median in
    the siblings' bucket, nobody exceeded it, and a 200x faster median came out p = 1 both ways. The choice is a
    function of the pooled counts alone, so under no difference (the arms exchangeable) the Fisher test keeps its
    level."""
    pooled = np.asarray(a.counts) + np.asarray(b.counts)
    total = pooled.sum()
    cumulative = np.cumsum(pooled)
    upper = int(np.searchsorted(cumulative, q * total, side="left"))
    if upper == 0:
        return upper
    above_upper, above_lower = (total - cumulative[upper]) / total, (total - cumulative[upper - 1]) / total
    return upper - 1 if abs(above_lower - (1 - q)) < abs(above_upper - (1 - q)) else upper


def compare_histograms(a: Histogram, b: Histogram, percentile: float, alpha: float = 0.05,
                       min_relative_change: float = 0.0) -> Comparison:
    """The same test on bucket counts (e.g. Prometheus increases over each window); both need the same buckets."""
    if a.upper_s != b.upper_s:
        raise ValueError("histograms must share bucket bounds")
    if a.total <= 0 or b.total <= 0:
        return Comparison(percentile, None, None, None, 1.0, 1.0, alpha, Difference.TOO_FEW_SAMPLES)
    q = percentile / 100
    boundary = _pooled_boundary(a, b, q)
    counts = _Exceedances(round(sum(a.counts[boundary + 1:])), round(a.total),
                          round(sum(b.counts[boundary + 1:])), round(b.total))
    p_better, p_worse = _fisher_one_sided(counts)
    a_s, b_s = a.quantile_s(q), b.quantile_s(q)
    a_value = None if a_s is None else a_s * 1000
    b_value = None if b_s is None else b_s * 1000
    ratio = _ratio(a_value, b_value)
    return Comparison(percentile, a_value, b_value, ratio, p_better, p_worse, alpha,
                      _verdict(p_better, p_worse, ratio, alpha, min_relative_change))
