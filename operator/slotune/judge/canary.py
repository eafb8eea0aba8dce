"""Canary verification: judge a candidate config on one replica against its siblings over the same window.

Before/after (slotune.judge.verification) compares window N (old config) with window N+1 (new config), so any drift of
the load between the two windows is read as the change's effect. A canary runs the candidate on one replica while
the others keep the old config and the traffic is split evenly between them, so both arms see the same load at the
same time and the drift cancels.

The stated test, per SLO percentile: the exact two-sample quantile test of slotune.judge.compare (pooled-quantile
threshold, one-sided Fisher exact test on exceedance counts; on bucket counts for Prometheus histograms, on samples
where there are samples), the canary as sample B and the pooled sibling replicas as sample A, each test one-sided
at ALPHA / 2, with an effect of at least MIN_EFFECT. Where the percentile's test sees no difference, the median's
decides if the percentile's estimate moved the same way by MIN_EFFECT (as before/after does: a tail percentile of
one window has few requests above it, its median far more). The canary is promoted when the targeted percentile is
better and no SLO percentile is worse; it is rolled back otherwise (worse: with the evidence; neither: no
improvement shown). Under A/A (the same config on both arms) a promotion needs the percentile's or the median's
test to fire by chance: the false-promote rate is at most ALPHA (Bonferroni) if the requests of a window were
exchangeable between the arms (bench/bench_canary.py measures it on real runtimes, where per-replica queues make
them only roughly so). Pods are not exchangeable on shared cores (two processes of one config measured 1.2-1.5x apart
in median in one window), so where the loop has A/A observations of its pods' spread (slotune.judge.canary_noise), a
shift is called only when the ratio is also beyond that spread's floor at the same level; within it, it is no
change, and the verdict says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from slotune.judge.canary_noise import NoiseFloor
from slotune.judge.compare import Comparison, Difference, compare_histograms, compare_samples
from slotune.judge.verification import MIN_EFFECT
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, LatencySummary, MetricsSnapshot

ALPHA = 0.05  # the false-promote rate under A/A the rule is built to stay under; each test runs at ALPHA / 2
METHOD = (f"canary: candidate on one replica vs the others over the same window; exact quantile test (pooled-"
          f"quantile threshold, one-sided Fisher) at {ALPHA / 2:g} per test, effect >= {MIN_EFFECT:.0%}")


class CanaryOutcome(StrEnum):
    PROMOTE = "promote"  # the targeted percentile (or its median, see above) better beyond noise, nothing worse
    WORSE = "worse"  # some SLO percentile of the canary is worse beyond noise: roll the canary back
    NO_GAIN = "no-gain"  # nothing shown either way: roll the canary back (a change must earn its place)
    TOO_FEW_SAMPLES = "too-few-samples"  # an arm served nothing in the window: judge another window


@dataclass(frozen=True)
class CanaryVerdict:
    outcome: CanaryOutcome
    targeted: Comparison
    worse: tuple[Comparison, ...]  # every SLO percentile the canary made worse beyond noise
    reason: str

    @property
    def promote(self) -> bool:
        return self.outcome is CanaryOutcome.PROMOTE


def compare_arms(baseline: LatencySummary, canary: LatencySummary, percentile: int,
                 alpha: float = ALPHA) -> Comparison:
    """The quantile test of one percentile, baseline replicas as A and the canary as B; samples where both have
    them, else bucket counts (both arms run one runtime, so their buckets match)."""
    if baseline.samples_ms and canary.samples_ms:
        return compare_samples(baseline.samples_ms, canary.samples_ms, percentile, alpha, MIN_EFFECT)
    if baseline.histogram is not None and canary.histogram is not None:
        return compare_histograms(baseline.histogram, canary.histogram, percentile, alpha, MIN_EFFECT)
    return Comparison(percentile, baseline.at(percentile), canary.at(percentile), None, 1.0, 1.0, alpha,
                      Difference.TOO_FEW_SAMPLES)


@dataclass(frozen=True)
class ArmShift:
    """Which way one SLO percentile of the canary moved, and the test that says so."""

    name: str
    verdict: Difference
    test: Comparison  # the percentile's own test
    median: Comparison | None = None  # the median's, when it decided
    spread: float | None = None  # the pods' A/A floor that explained a shift the test saw (verdict: no change)

    def describe(self) -> str:
        own = _describe(self.name, self.test)
        text = own if self.median is None else f"{_describe('median', self.median)} ({own})"
        return text if self.spread is None else f"{text}, within the pods' A/A spread x{self.spread:.2f}"


def arm_shift(baseline: LatencySummary, canary: LatencySummary, metric: LatencyMetric, percentile: int,
              alpha: float, floor: NoiseFloor | None = None) -> ArmShift:
    """The percentile's test; where it sees no difference, the median's, if the percentile's estimate moved the
    same way by MIN_EFFECT (a tail has few requests above it, and ties in its bucket only count against the test:
    a canary whose every request sits in the top bucket moves the median, not the pooled P99's exceedances).
    A shift the pods' own A/A spread explains (`floor`, at the same level) is no change."""
    name = f"{metric.value}_p{percentile}"
    test = compare_arms(baseline, canary, percentile, alpha)
    if test.verdict in (Difference.BETTER, Difference.WORSE):
        spread = floor.explains(metric, percentile, test.ratio, alpha) if floor is not None else None
        return ArmShift(name, Difference.NO_CHANGE if spread else test.verdict, test, spread=spread)
    if test.verdict is not Difference.NO_CHANGE or percentile == 50 or test.ratio is None:
        return ArmShift(name, test.verdict, test)
    median = compare_arms(baseline, canary, 50, alpha)
    if median.verdict is Difference.BETTER and test.ratio <= 1 - MIN_EFFECT:
        moved = Difference.BETTER
    elif median.verdict is Difference.WORSE and test.ratio >= 1 + MIN_EFFECT:
        moved = Difference.WORSE
    else:
        return ArmShift(name, Difference.NO_CHANGE, test)
    spread = floor.explains(metric, 50, median.ratio, alpha) if floor is not None else None
    return ArmShift(name, Difference.NO_CHANGE if spread else moved, test, median, spread)


def judge(baseline: MetricsSnapshot, canary: MetricsSnapshot, target: LatencyMetric, percentile: int,
          slo: SLOSpec, alpha: float = ALPHA, floor: NoiseFloor | None = None) -> CanaryVerdict:
    """Promote or roll back the canary from one window of both arms (see the module docstring for the rule);
    `floor`: the pods' A/A spread (slotune.judge.canary_noise), None for the exact test alone."""
    alpha = alpha / 2
    others = [t for t in slo.targets() if (t.metric, t.percentile) != (target, percentile)]
    targeted = arm_shift(baseline.latency(target), canary.latency(target), target, percentile, alpha, floor)
    checks = [targeted] + [arm_shift(baseline.latency(t.metric), canary.latency(t.metric), t.metric, t.percentile,
                                     alpha, floor) for t in others]
    worse = [check for check in checks if check.verdict is Difference.WORSE]
    if targeted.verdict is Difference.TOO_FEW_SAMPLES:
        return CanaryVerdict(CanaryOutcome.TOO_FEW_SAMPLES, targeted.test, (),
                             "an arm served no requests in the window")
    if worse:
        return CanaryVerdict(CanaryOutcome.WORSE, targeted.test, tuple(c.test for c in worse),
                             f"canary worse than its siblings: {'; '.join(c.describe() for c in worse)}")
    if targeted.verdict is Difference.BETTER:
        return CanaryVerdict(CanaryOutcome.PROMOTE, targeted.test, (),
                             f"canary better than its siblings: {targeted.describe()}")
    return CanaryVerdict(CanaryOutcome.NO_GAIN, targeted.test, (),
                         f"canary not better than its siblings: {targeted.describe()}")


def _describe(name: str, test: Comparison) -> str:
    """`ttft_p99 120.0 (siblings) vs 80.0 ms (canary), x0.67, p=0.001`."""
    a = "n/a" if test.a_ms is None else f"{test.a_ms:.1f}"
    b = "n/a" if test.b_ms is None else f"{test.b_ms:.1f}"
    ratio = "" if test.ratio is None else f", x{test.ratio:.2f}"
    p = min(test.p_better, test.p_worse)
    return f"{name} {a} (siblings) vs {b} ms (canary){ratio}, p={p:.2g}"
