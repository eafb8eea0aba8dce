"""Verification of one change: did the targeted metric improve beyond noise, and did nothing else get worse?

With per-request samples (client-side windows, the simulator), the targeted percentile's ratio after / before gets a
bootstrap confidence interval (Efron & Tibshirani 1993, percentile method). Latencies of neighbouring requests are
correlated (they queue behind the same burst), so samples are resampled in contiguous blocks of ~sqrt(n) in arrival
order (moving block bootstrap, Kuensch 1989); resampling single requests would make intervals several times too narrow.
With histograms only (Prometheus bucket increases, the operator's windows) there is no arrival order to keep, so the
two windows' bucket counts go through the exact two-sample quantile test of slotune.judge.compare (pooled-quantile
threshold, one-sided Fisher test) at the same one-sided level as the interval, plus the same minimum effect.
A change is kept when the metric improved beyond noise (interval below 1 - MIN_EFFECT, or the test says better) and
no other SLO metric or the throughput floor got worse beyond tolerance, or when it turned a violated SLO into a met one
without breaking anything, or (for a change that costs nothing, like prefix caching) when its estimate improved and
nothing got worse. A/A pairs (the same config twice) rarely pass (tests/unit/test_policy.py measures both paths).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from slotune.judge.compare import Difference, compare_histograms
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, LatencySummary, MetricsSnapshot

BOOTSTRAP_RESAMPLES = 400
CONFIDENCE = 0.95
TOLERANCE = 0.10  # another metric may get this much worse before it counts as a regression
MIN_EFFECT = 0.05  # an improvement must be at least this large at the interval's edge to count


@dataclass(frozen=True)
class MetricChange:
    name: str
    before_ms: float | None
    after_ms: float | None
    ratio_low: float  # confidence interval of after / before (nan when a test on histograms decided instead)
    ratio_high: float
    improved: bool  # faster beyond noise and by at least MIN_EFFECT
    worsened: bool
    evidence: str = ""  # how the verdict was reached, when not from the interval

    @classmethod
    def from_interval(cls, name: str, before_ms: float | None, after_ms: float | None, low: float,
                      high: float) -> MetricChange:
        return cls(name, before_ms, after_ms, low, high, high < 1.0 - MIN_EFFECT, low > 1.0 + MIN_EFFECT)

    def describe(self) -> str:
        """`ttft_p99 7400.0 -> 38.9 ms (190x faster, interval x0.0049..x0.0055; quantile test p=2e-08)`: the effect
        size, its interval (after / before) and, where a test decided, its p-value."""
        before = "n/a" if self.before_ms is None else f"{self.before_ms:.1f}"
        after = "n/a" if self.after_ms is None else f"{self.after_ms:.1f}"
        parts = [_effect(self.before_ms, self.after_ms)]
        if np.isfinite(self.ratio_low) and np.isfinite(self.ratio_high):
            parts.append(f"interval x{self.ratio_low:.2g}..x{self.ratio_high:.2g}")
        detail = ", ".join(p for p in parts if p) + (f"; {self.evidence}" if self.evidence else "")
        return f"{self.name} {before} -> {after} ms ({detail})" if detail else f"{self.name} {before} -> {after} ms"


@dataclass(frozen=True)
class Judgement:
    keep: bool
    reason: str
    targeted: MetricChange
    regressions: tuple[str, ...]
    slo_met_after: bool

    @property
    def inconclusive(self) -> bool:
        """Not kept, nothing got worse, and the targeted metric's estimate moved the right way by at least
        MIN_EFFECT: another window could show the improvement beyond noise."""
        before, after = self.targeted.before_ms, self.targeted.after_ms
        moved = before is not None and after is not None and after < (1.0 - MIN_EFFECT) * before
        return not self.keep and not self.regressions and moved


def compare(before: LatencySummary, after: LatencySummary, percentile: int, name: str,
            seed: int = 0) -> MetricChange:
    """Did one percentile change beyond noise from `before` to `after`?"""
    b, a = before.at(percentile), after.at(percentile)
    if b is None or a is None or b <= 0:
        return MetricChange(name, b, a, float("nan"), float("nan"), False, False)
    if before.samples_ms and after.samples_ms and len(before.samples_ms) > 1 and len(after.samples_ms) > 1:
        low, high = _bootstrap(np.asarray(before.samples_ms), np.asarray(after.samples_ms), percentile, seed)
        return MetricChange.from_interval(name, b, a, low, high)
    if before.histogram is not None and after.histogram is not None and (
            before.histogram.upper_s == after.histogram.upper_s):
        test = compare_histograms(before.histogram, after.histogram, percentile, alpha=(1 - CONFIDENCE) / 2,
                                  min_relative_change=MIN_EFFECT)
        p = test.p_better if a < b else test.p_worse  # the p-value of the direction it moved
        decided = test.verdict in (Difference.BETTER, Difference.WORSE)
        (b_low, b_high), (a_low, a_high) = _bucket_bounds(before, b), _bucket_bounds(after, a)
        return MetricChange(name, b, a, a_low / b_high, a_high / max(b_low, 1e-9),
                            test.verdict is Difference.BETTER, test.verdict is Difference.WORSE,
                            f"quantile test p={p:.2g}" if decided else "")
    b_low, b_high = _bucket_bounds(before, b)
    a_low, a_high = _bucket_bounds(after, a)
    return MetricChange.from_interval(name, b, a, a_low / b_high, a_high / max(b_low, 1e-9))


def verify(before: MetricsSnapshot, after: MetricsSnapshot, target: LatencyMetric, percentile: int, slo: SLOSpec,
           tolerance: float = TOLERANCE, costs_nothing: bool = False,
           earlier_after: MetricsSnapshot | None = None) -> Judgement:
    """`earlier_after`: a window of the same change measured before `after` whose verdict was inconclusive; the
    targeted metric is then tested on both windows pooled (the other metrics and the SLO on `after` alone).
    A speculation change rolled back says the draft acceptance it measured, so the history shows why it lost."""
    verdict = _verify(before, after, target, percentile, slo, tolerance, costs_nothing, earlier_after)
    measured = after.spec_acceptance_rate
    if not verdict.keep and measured is not None and before.spec_acceptance_rate is None:
        return replace(verdict, reason=f"{verdict.reason}; measured draft acceptance {measured:.2f} (accepted / "
                       "drafted tokens)")
    return verdict


def _verify(before: MetricsSnapshot, after: MetricsSnapshot, target: LatencyMetric, percentile: int, slo: SLOSpec,
           tolerance: float = TOLERANCE, costs_nothing: bool = False,
           earlier_after: MetricsSnapshot | None = None) -> Judgement:
    targeted_after = after.latency(target)
    if earlier_after is not None:
        targeted_after = earlier_after.latency(target).pooled(targeted_after)
    targeted = compare(before.latency(target), targeted_after, percentile, f"{target.value}_p{percentile}")
    regressions = _regressions(before, after, slo, tolerance, skip=targeted.name)
    met_before, met_after = slo.is_met(before), slo.is_met(after)
    if regressions:
        return Judgement(False, "regressed: " + "; ".join(regressions), targeted, regressions, met_after)
    if met_after and not met_before:
        return Judgement(True, f"SLO now met; {targeted.describe()}", targeted, (), True)
    if targeted.improved:
        return Judgement(True, f"improved beyond noise: {targeted.describe()}", targeted, (), met_after)
    # A tail percentile of one window is a noisy estimator; the median of the same metric moves with it when the
    # whole distribution shifts and is far steadier. Accept a shift proven at the median when the tail's point
    # estimate moved the same way.
    median = compare(before.latency(target), targeted_after, 50, f"{target.value}_p50")
    tail_moved = (targeted.after_ms or 0.0) < (targeted.before_ms or 0.0)
    if percentile != 50 and median.improved and tail_moved:
        return Judgement(True, f"improved beyond noise at the median: {median.describe()}; "
                            f"{targeted.describe()}", targeted, (), met_after)
    # A change with no downside (policy.costs_nothing) need not prove itself beyond noise: rolling it back on an
    # inconclusive window would only throw away work saved, so it stays when its estimate moved the right way.
    if costs_nothing and (targeted.after_ms or 0.0) < (1.0 - MIN_EFFECT) * (targeted.before_ms or 0.0):
        return Judgement(True, f"costs nothing and not worse: {targeted.describe()}", targeted, (), met_after)
    return Judgement(False, f"no improvement beyond noise: {targeted.describe()}", targeted, (), met_after)


def _regressions(before: MetricsSnapshot, after: MetricsSnapshot, slo: SLOSpec, tolerance: float,
                 skip: str) -> tuple[str, ...]:
    found = []
    for result_before, result_after in zip(slo.evaluate(before), slo.evaluate(after), strict=True):
        t = result_after.target
        if t.name == skip or result_after.met:
            continue
        change = compare(before.latency(t.metric), after.latency(t.metric), t.percentile, t.name)
        ratio = (result_after.observed_ms or float("inf")) / max(result_before.observed_ms or 1e-9, 1e-9)
        if change.worsened and ratio > 1 + tolerance:
            found.append(f"{change.describe()} breaks its {t.target_ms:g} ms target")
    floor = slo.min_throughput
    if floor is not None and after.generation_tokens_per_s < floor and (
            after.generation_tokens_per_s < (1 - tolerance) * before.generation_tokens_per_s):
        found.append(f"throughput {before.generation_tokens_per_s:.0f} -> {after.generation_tokens_per_s:.0f} "
                     f"tokens/s is below the {floor:g} floor")
    if after.num_failed_requests > before.num_failed_requests + max(1, tolerance * after.num_requests):
        found.append(f"failed requests {before.num_failed_requests} -> {after.num_failed_requests}")
    return tuple(found)


def _bootstrap(before: np.ndarray, after: np.ndarray, percentile: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    b = np.percentile(_block_resamples(before, rng), percentile, axis=1)
    a = np.percentile(_block_resamples(after, rng), percentile, axis=1)
    ratios = a / np.maximum(b, 1e-9)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def _block_resamples(samples: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """BOOTSTRAP_RESAMPLES rows, each n samples glued from random contiguous blocks of length ~sqrt(n)."""
    n = samples.size
    block = max(1, round(np.sqrt(n)))
    num_blocks = -(-n // block)
    starts = rng.integers(0, n - block + 1, (BOOTSTRAP_RESAMPLES, num_blocks))
    index = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(BOOTSTRAP_RESAMPLES, -1)[:, :n]
    return samples[index]


def _effect(before_ms: float | None, after_ms: float | None) -> str:
    """The effect size in words a person compares: 190x faster, 1.3x slower, unchanged."""
    if not before_ms or not after_ms:
        return ""
    ratio = after_ms / before_ms
    if abs(ratio - 1.0) < 0.005:
        return "unchanged"
    return f"{1 / ratio:.3g}x faster" if ratio < 1 else f"{ratio:.3g}x slower"


def _bucket_bounds(summary: LatencySummary, value_ms: float) -> tuple[float, float]:
    if summary.histogram is None:
        return value_ms * (1 - TOLERANCE), value_ms * (1 + TOLERANCE)
    low_s, high_s = summary.histogram.bucket_of(value_ms / 1000.0)
    high_ms = high_s * 1000.0 if np.isfinite(high_s) else value_ms * 2
    return max(low_s * 1000.0, 1e-9), high_ms
