"""Whether the SLO holds with confidence, not by a point estimate: an upper confidence bound on each percentile.

One window's P99 of 150 requests is roughly its second-largest sample; a config whose true P99 sits at the target
meets it in about half the windows. The bound is distribution-free (no shape assumed for latencies): the k-th
smallest of n samples is an upper bound of the p-quantile at confidence c when P(Binomial(n, p) <= k - 1) >= c, since
the k-th order statistic lies below the quantile only when at least k samples do (Hahn & Meeker 1991, "Statistical
Intervals", s.5.3; the order-statistic bound of an exact binomial test). From histograms (Prometheus) the same order
statistic is read as the upper edge of its bucket. Windows pool (`pool`) until the sample count can bound the
percentile at all: at c = 0.8 a P99 needs 161 samples, so a streak of 150-request windows is judged on two.
That bound treats requests as independent; they are not (a burst slows every request in it), and the SLO is judged
per window, so the windows' own percentiles vary more than pooled samples show (one config's TTFT P99 read 1.5-2.8 s
over 16 windows of one workload). Across two or more windows the bound is therefore also at least the one-sided
prediction bound for the next window's percentile from the streak's: mean + t(c', n - 1) * sd * sqrt(1 + 1/n)
(the Student-t prediction interval for a new observation; Hahn & Meeker s.4.4), and the larger of the two decides.
That prediction is made at NEXT_WINDOW_CONFIDENCE c' = 0.9, not 0.8: a prediction bound at 0.8 still lets one window
in five miss, and configs at the SLO's edge did exactly that (a summarization config's TTFT P99 missed 3 of 15
windows, a bursty chat config's 1 of 9, after converging with bounds of 87% and 97% of the target at 0.8). The
order-statistic bound stays at 0.8: it bounds the pooled tail, which more windows estimate ever better.
Requests that failed count as above every target. The margin is how far the bound sits under the target.

A target judged by attainment (slo.attainment: a share of requests within it) is bounded from the counts: the
Clopper-Pearson lower bound of the share within (the exact binomial bound: the p with P(Binomial(n, p) >= x) = 1 - c;
Clopper & Pearson 1934) must reach the required share. That is the same verdict as the order-statistic bound of the
quantile at the required share against the target (x >= k exactly when that bound holds), read without interpolation
when an edge sits at the target; with no edge there, the count at the lower edge of the target's bucket is used, so
the bound stays conservative. Across windows the lower one-sided Student-t prediction bound of the per-window shares
also counts, as for percentiles.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from slotune.slo import Attained, SLOSpec, SLOTarget, attained
from slotune.snapshot import LatencySummary, MetricsSnapshot

CONFIDENCE = 0.8  # one-sided: a config that misses with 20% odds per bound is re-tried, not declared converged
NEXT_WINDOW_CONFIDENCE = 0.9  # the next window's percentile: the SLO is judged per window (module docstring)


@dataclass(frozen=True)
class AttainmentBound:
    """The share of requests within a target judged by attainment, over the streak pooled."""

    required: float
    attained: Attained
    lower: float  # lower confidence bound of the share within

    @property
    def holds(self) -> bool:
        return self.lower >= self.required

    def describe(self) -> str:
        return (f"{self.attained.describe()} {self.attained.total:.0f} requests, bound {self.lower:.2%} at "
                f"{CONFIDENCE:.0%} vs {self.required:.2%} required")


@dataclass(frozen=True)
class TargetBound:
    target: SLOTarget
    observed_ms: float | None  # the point estimate
    upper_ms: float | None  # the upper confidence bound; None: too few samples to bound this percentile
    attainment: AttainmentBound | None = None  # set when slo.attainment judges this target

    @property
    def holds(self) -> bool:
        if self.upper_ms is None:
            return False
        if self.attainment is not None:
            return self.attainment.holds
        return self.upper_ms <= self.target.target_ms

    @property
    def margin(self) -> float | None:
        """Spare share of the target at the bound (0.1: the bound is 10% under the target; negative: over)."""
        return None if self.upper_ms is None else 1.0 - self.upper_ms / self.target.target_ms

    def describe(self) -> str:
        if self.attainment is not None:
            return f"{self.target.name} {self.target.target_ms:g} ms: {self.attainment.describe()}"
        if self.upper_ms is None:
            return f"{self.target.name}: too few samples to bound"
        return (f"{self.target.name} {self.observed_ms or 0:.1f} ms, bound {self.upper_ms:.1f} ms at "
                f"{CONFIDENCE:.0%} ({NEXT_WINDOW_CONFIDENCE:.0%} for the next window) vs target "
                f"{self.target.target_ms:g} ms (margin {self.margin:+.0%})")


def order_statistic_rank(n: int, percentile: float, confidence: float = CONFIDENCE) -> int | None:
    """The 1-based rank k of the smallest order statistic that bounds the percentile from above; None if n is too
    small (even the largest sample bounds it with less confidence)."""
    if n <= 0:
        return None
    k = int(stats.binom.ppf(confidence, n, percentile / 100.0)) + 1  # smallest k with cdf(k - 1) >= confidence
    while k > 1 and stats.binom.cdf(k - 2, n, percentile / 100.0) >= confidence:
        k -= 1
    return k if k <= n else None


def upper_bound_ms(summary: LatencySummary, percentile: float, failed: int = 0,
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


def bounds(slo: SLOSpec, windows: Sequence[MetricsSnapshot], confidence: float = CONFIDENCE,
           next_window: float | None = None) -> list[TargetBound]:
    """Each target's bound over a streak of windows of one config (see the module docstring)."""
    next_window = NEXT_WINDOW_CONFIDENCE if next_window is None else next_window
    pooled = functools.reduce(pool, windows)
    failed = pooled.num_failed_requests
    found = []
    for t in slo.targets():
        required = slo.required(t)
        judged = attainment_bound(t, required, windows, pooled, confidence, next_window) if required is not None \
            else None
        if judged is not None:
            upper = upper_bound_ms(pooled.latency(t.metric), required * 100.0, failed, confidence)
            found.append(TargetBound(t, pooled.latency(t.metric).at(t.percentile), upper, judged))
            continue
        upper = upper_bound_ms(pooled.latency(t.metric), t.percentile, failed, confidence)
        per_window = [w.latency(t.metric).at(t.percentile) for w in windows]
        predicted = prediction_bound([v for v in per_window if v is not None], next_window)
        if upper is not None and predicted is not None:
            upper = max(upper, predicted)
        found.append(TargetBound(t, pooled.latency(t.metric).at(t.percentile), upper))
    return found


def attainment_bound(target: SLOTarget, required: float, windows: Sequence[MetricsSnapshot],
                     pooled: MetricsSnapshot, confidence: float = CONFIDENCE,
                     next_window: float = NEXT_WINDOW_CONFIDENCE) -> AttainmentBound | None:
    """The share within `target` over the windows pooled and its lower bound; None without per-request evidence."""
    found = attained(pooled.latency(target.metric), target.target_ms, pooled.num_failed_requests)
    if found is None:
        return None
    lower = share_lower_bound(round(found.within_low), round(found.total), confidence)
    shares = [a.fraction for w in windows
              if (a := attained(w.latency(target.metric), target.target_ms, w.num_failed_requests)) is not None]
    predicted = prediction_bound([-share for share in shares], next_window)  # the lower bound, mirrored
    if predicted is not None:
        lower = min(lower, -predicted)
    return AttainmentBound(required, found, lower)


def share_lower_bound(within: int, total: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson lower confidence bound of a binomial proportion `within / total`."""
    if within <= 0 or total <= 0:
        return 0.0
    within = min(within, total)  # extrapolated counts (Prometheus' increase()) can round past the total
    return float(stats.beta.ppf(1.0 - confidence, within, total - within + 1))


def prediction_bound(values: Sequence[float], confidence: float = CONFIDENCE) -> float | None:
    """One-sided upper prediction bound for the next observation, from at least two (Student t)."""
    n = len(values)
    if n < 2:
        return None
    mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    return mean + float(stats.t.ppf(confidence, n - 1)) * sd * math.sqrt(1 + 1 / n)


def holds(slo: SLOSpec, windows: Sequence[MetricsSnapshot], confidence: float = CONFIDENCE) -> bool:
    """Every target's bound under its target, and the throughput floor met in the latest window."""
    return all(b.holds for b in bounds(slo, windows, confidence)) and slo.throughput_met(windows[-1])


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
