"""Whether the SLO holds with confidence, not by a point estimate: an upper confidence bound on each percentile.

One window's P99 of 150 requests is roughly its second-largest sample; a config whose true P99 sits at the target
meets it in about half the windows. The bound is distribution-free (no shape assumed for latencies): the k-th
smallest of n samples is an upper bound of the p-quantile at confidence c when P(Binomial(n, p) <= k - 1) >= c, since
the k-th order statistic lies below the quantile only when at least k samples do (Hahn & Meeker 1991, "Statistical
Intervals", s.5.3; the order-statistic bound of an exact binomial test). From histograms (Prometheus) the same order
statistic is read as the upper edge of its bucket. Windows pool (`pool`) until the sample count can bound the
percentile at all: at c = 0.8 a P99 needs 161 samples, so a streak of 150-request windows is judged on two.
Requests that failed count as above every target. The margin is how far the bound sits under the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from slotune.slo import SLOSpec, SLOTarget
from slotune.snapshot import LatencySummary, MetricsSnapshot

CONFIDENCE = 0.8  # one-sided: a config that misses with 20% odds per bound is re-tried, not declared converged


@dataclass(frozen=True)
class TargetBound:
    target: SLOTarget
    observed_ms: float | None  # the point estimate
    upper_ms: float | None  # the upper confidence bound; None: too few samples to bound this percentile

    @property
    def holds(self) -> bool:
        return self.upper_ms is not None and self.upper_ms <= self.target.target_ms

    @property
    def margin(self) -> float | None:
        """Spare share of the target at the bound (0.1: the bound is 10% under the target; negative: over)."""
        return None if self.upper_ms is None else 1.0 - self.upper_ms / self.target.target_ms

    def describe(self) -> str:
        if self.upper_ms is None:
            return f"{self.target.name}: too few samples to bound"
        return (f"{self.target.name} {self.observed_ms or 0:.1f} ms, bound {self.upper_ms:.1f} ms at "
                f"{CONFIDENCE:.0%} vs target {self.target.target_ms:g} ms (margin {self.margin:+.0%})")


def order_statistic_rank(n: int, percentile: float, confidence: float = CONFIDENCE) -> int | None:
    """The 1-based rank k of the smallest order statistic that bounds the percentile from above; None if n is too
    small (even the largest sample bounds it with less confidence)."""
    if n <= 0:
        return None
    k = int(stats.binom.ppf(confidence, n, percentile / 100.0)) + 1  # smallest k with cdf(k - 1) >= confidence
    while k > 1 and stats.binom.cdf(k - 2, n, percentile / 100.0) >= confidence:
        k -= 1
    return k if k <= n else None


def upper_bound_ms(summary: LatencySummary, percentile: int, failed: int = 0,
                   confidence: float = CONFIDENCE) -> float | None:
    """Upper confidence bound of the percentile; `failed` requests count as infinitely slow."""
    if summary.samples_ms:
        values = np.sort(np.asarray(summary.samples_ms, dtype=float))
        values = np.concatenate([values, np.full(failed, math.inf)])
        k = order_statistic_rank(values.size, percentile, confidence)
        return None if k is None else float(values[k - 1])
    histogram = summary.histogram
    if histogram is None:
        return None
    total = round(histogram.total) + failed
    k = order_statistic_rank(total, percentile, confidence)
    if k is None:
        return None
    seen = 0.0
    for upper_s, count in zip(histogram.upper_s, histogram.counts, strict=True):
        seen += count
        if seen >= k:
            return upper_s * 1000.0
    return math.inf


def bounds(slo: SLOSpec, window: MetricsSnapshot, confidence: float = CONFIDENCE) -> list[TargetBound]:
    failed = window.num_failed_requests
    return [TargetBound(t, window.latency(t.metric).at(t.percentile),
                        upper_bound_ms(window.latency(t.metric), t.percentile, failed, confidence))
            for t in slo.targets()]


def holds(slo: SLOSpec, window: MetricsSnapshot, confidence: float = CONFIDENCE) -> bool:
    """Every target's bound under its target, and the throughput floor met."""
    return all(b.holds for b in bounds(slo, window, confidence)) and slo.throughput_met(window)


def pool(first: MetricsSnapshot, then: MetricsSnapshot) -> MetricsSnapshot:
    """Two windows of one config as one for the SLO: latencies pooled (samples or bucket counts), failures
    summed; the rest (rates, gauges) from the later window."""
    pooled = {name: getattr(first, name).pooled(getattr(then, name)) for name in ("ttft", "tpot", "e2e")}
    return replace(then, num_requests=first.num_requests + then.num_requests,
                   num_failed_requests=first.num_failed_requests + then.num_failed_requests, **pooled)


def tightened(slo: SLOSpec, found: list[TargetBound]) -> SLOSpec:
    """The SLO with each target whose bound misses it scaled down by observed / bound: the point estimate of the
    window then violates exactly where the bound does, so the diagnosis and policy size the margin to add."""
    scaled: dict[str, dict[str, float]] = {}
    for b in found:
        if b.holds or b.observed_ms is None or b.upper_ms is None or not math.isfinite(b.upper_ms):
            continue
        factor = min(b.observed_ms / b.upper_ms, 0.99)
        scaled.setdefault(b.target.metric.value, {})[f"p{b.target.percentile}"] = b.target.target_ms * factor
    if not scaled:
        return slo
    updates = {}
    for metric, targets in scaled.items():
        current = getattr(slo, metric)
        updates[metric] = current.model_copy(update=targets)
    return slo.model_copy(update=updates)
