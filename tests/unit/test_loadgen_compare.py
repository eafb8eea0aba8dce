"""A/B comparison: seeded A/A trials claim a difference at most at the stated rate; a 2x slowdown is found."""

from __future__ import annotations

import numpy as np
import pytest

from slotune.judge.canary import arm_shift
from slotune.judge.compare import Difference, compare_histograms, compare_samples
from slotune.snapshot import Histogram, LatencyMetric, LatencySummary

ALPHA = 0.05
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10, 20, 40, 80,
                  160, 640, 2560, np.inf)


def _latencies_ms(rng: np.random.Generator, size: int, median_ms: float = 80.0) -> np.ndarray:
    return rng.lognormal(np.log(median_ms), 0.5, size)  # a typical right-skewed latency


def _histogram(samples_ms: np.ndarray) -> Histogram:
    edges_s = (0.0, *TTFT_BUCKETS_S)
    counts, _ = np.histogram(samples_ms / 1000, bins=edges_s)
    return Histogram(TTFT_BUCKETS_S, tuple(float(c) for c in counts))


@pytest.mark.parametrize("percentile", [50, 95, 99])
def test_aa_false_positive_rate_is_at_most_alpha_on_samples(percentile: int) -> None:
    rng = np.random.default_rng(percentile)
    trials = 3000  # binomial noise ~0.4%: the true rate (about 3-4.5%, Fisher is conservative) stays below 5%
    verdicts = [compare_samples(_latencies_ms(rng, 400), _latencies_ms(rng, 400), percentile, ALPHA).verdict
                for _ in range(trials)]
    assert verdicts.count(Difference.BETTER) / trials <= ALPHA
    assert verdicts.count(Difference.WORSE) / trials <= ALPHA


@pytest.mark.parametrize("percentile", [50, 95, 99])
def test_aa_false_positive_rate_is_at_most_alpha_on_histograms(percentile: int) -> None:
    rng = np.random.default_rng(100 + percentile)
    trials = 3000  # binomial noise ~0.4%: the true rate (about 3-4.5%, Fisher is conservative) stays below 5%
    verdicts = [compare_histograms(_histogram(_latencies_ms(rng, 400)), _histogram(_latencies_ms(rng, 400)),
                                   percentile, ALPHA).verdict for _ in range(trials)]
    assert verdicts.count(Difference.BETTER) / trials <= ALPHA
    assert verdicts.count(Difference.WORSE) / trials <= ALPHA


@pytest.mark.parametrize("percentile", [50, 95, 99])
def test_a_2x_slowdown_is_detected_in_samples_and_histograms(percentile: int) -> None:
    rng = np.random.default_rng(7)
    a, b = _latencies_ms(rng, 1000), 2.0 * _latencies_ms(rng, 1000)
    slower = compare_samples(a, b, percentile, ALPHA, min_relative_change=0.1)
    assert slower.verdict == Difference.WORSE and slower.ratio == pytest.approx(2.0, rel=0.25)
    assert compare_samples(b, a, percentile, ALPHA).verdict == Difference.BETTER
    from_buckets = compare_histograms(_histogram(a), _histogram(b), percentile, ALPHA, min_relative_change=0.1)
    assert from_buckets.verdict == Difference.WORSE and from_buckets.p_worse < ALPHA
    assert compare_histograms(_histogram(b), _histogram(a), percentile, ALPHA).verdict == Difference.BETTER


def test_a_significant_change_smaller_than_the_tolerance_is_no_change() -> None:
    rng = np.random.default_rng(3)
    a, b = _latencies_ms(rng, 20000), 0.95 * _latencies_ms(rng, 20000)
    result = compare_samples(a, b, 50, ALPHA, min_relative_change=0.10)
    assert result.p_better < ALPHA and result.verdict == Difference.NO_CHANGE
    assert compare_samples(a, b, 50, ALPHA).verdict == Difference.BETTER


def test_empty_windows_and_mismatched_buckets() -> None:
    assert compare_samples([], [1.0], 99).verdict == Difference.TOO_FEW_SAMPLES
    empty = Histogram(TTFT_BUCKETS_S, (0.0,) * len(TTFT_BUCKETS_S))
    assert compare_histograms(empty, empty, 50).verdict == Difference.TOO_FEW_SAMPLES
    with pytest.raises(ValueError, match="bucket bounds"):
        compare_histograms(empty, Histogram((1.0, np.inf), (1.0, 1.0)), 50)


def _in_buckets(counts: dict[int, float]) -> Histogram:
    return Histogram(TTFT_BUCKETS_S, tuple(counts.get(i, 0.0) for i in range(len(TTFT_BUCKETS_S))))


def test_an_arm_whose_whole_mass_ties_in_the_pooled_quantiles_bucket_is_still_compared() -> None:
    # The windows of an e2e canary (seqs 1 siblings against a seqs 16 canary): every sibling request in (1, 2.5] s,
    # every canary request under 20 ms. The pooled median falls in the siblings' bucket; counting exceedances above
    # its upper edge, nobody exceeded it and both one-sided p-values were 1, so the canary rule (a P99 that cannot
    # tell, then the median) called a 200x faster canary "no gain".
    siblings = _in_buckets({12: 85.5})
    canary = _in_buckets({1: 10.3, 2: 47.6, 3: 7.8})
    better = compare_histograms(siblings, canary, 50, ALPHA, min_relative_change=0.05)
    assert better.verdict == Difference.BETTER and better.p_better < 1e-6, better
    assert compare_histograms(canary, siblings, 50, ALPHA).verdict == Difference.WORSE
    assert arm_shift(LatencySummary.from_histogram(siblings), LatencySummary.from_histogram(canary), LatencyMetric.TTFT,
                 99, ALPHA / 2).verdict == Difference.BETTER


@pytest.mark.parametrize("percentile", [50, 95, 99])
def test_aa_false_positive_rate_is_at_most_alpha_on_coarse_buckets(percentile: int) -> None:
    # Heavy ties: most requests of both arms in one or two wide buckets, where the tie side decides the threshold.
    rng = np.random.default_rng(200 + percentile)
    trials = 3000
    verdicts = [compare_histograms(_histogram(_latencies_ms(rng, 200, 1500.0)),
                                   _histogram(_latencies_ms(rng, 200, 1500.0)), percentile, ALPHA).verdict
                for _ in range(trials)]
    assert verdicts.count(Difference.BETTER) / trials <= ALPHA
    assert verdicts.count(Difference.WORSE) / trials <= ALPHA
