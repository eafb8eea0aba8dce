"""Latency SLO targets and the one rule for whether a window meets them.

`SLOSpec` is the `spec.slo` block of a TunedModel (camelCase on the wire) and the yardstick of the load generator,
the tuner and the status. Targets are in milliseconds at P50/P95/P99 of TTFT, TPOT and end-to-end latency.

With `attainment` set, each metric's loosest target (its highest percentile, the per-request bound vLLM's goodput
takes too) is judged by the share of requests within it, counted (`attained`): exactly from per-request samples or
from a histogram with an edge at the target (the builtin runtime's --slo-bucket-edges), else bracketed by the counts
at the two edges of the bucket that holds the target (vLLM's fixed buckets), where a percentile read by
`histogram_quantile` is an interpolation. Failed requests count as outside every target.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from slotune.snapshot import LatencyMetric, LatencySummary, MetricsSnapshot

PERCENTILES = (50, 95, 99)
SLO_METRICS = (LatencyMetric.TTFT, LatencyMetric.TPOT, LatencyMetric.E2E)


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


class PercentileTargets(_Spec):
    """Upper bounds in milliseconds at each percentile; leave a percentile out to not constrain it."""

    p50: float | None = Field(default=None, gt=0, description="Target for the median, in milliseconds.")
    p95: float | None = Field(default=None, gt=0, description="Target for the 95th percentile, in milliseconds.")
    p99: float | None = Field(default=None, gt=0, description="Target for the 99th percentile, in milliseconds.")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        present = [(p, v) for p, v in ((50, self.p50), (95, self.p95), (99, self.p99)) if v is not None]
        if not present:
            raise ValueError("set at least one of p50, p95, p99")
        for (p_low, low), (p_high, high) in itertools.pairwise(present):
            if low > high:
                raise ValueError(f"p{p_low} ({low} ms) must not exceed p{p_high} ({high} ms)")
        return self

    def at(self, percentile: int) -> float | None:
        return {50: self.p50, 95: self.p95, 99: self.p99}[percentile]


@dataclass(frozen=True)
class SLOTarget:
    """One constraint: metric at percentile must be at most target_ms."""

    metric: LatencyMetric
    percentile: int
    target_ms: float

    @property
    def name(self) -> str:
        return f"{self.metric.value}_p{self.percentile}"


@dataclass(frozen=True)
class Attained:
    """Requests within one target over a window. `within` is the count (exact, or interpolated linearly inside the
    bucket holding the target, as histogram_quantile does); the true count lies in [within_low, within_high]."""

    within: float
    within_low: float
    within_high: float
    total: float  # requests judged, failed ones included (Prometheus' increase() extrapolates: not always whole)
    bucket_ms: tuple[float, float] | None = None  # the bucket holding the target, when no edge sits at it

    @property
    def exact(self) -> bool:
        return self.within_low == self.within_high

    @property
    def fraction(self) -> float:
        return self._share(self.within)

    @property
    def fraction_low(self) -> float:
        return self._share(self.within_low)

    @property
    def fraction_high(self) -> float:
        return self._share(self.within_high)

    def _share(self, count: float) -> float:
        return min(count / self.total, 1.0) if self.total > 0 else 0.0

    def describe(self) -> str:
        text = f"{self.fraction:.2%} within"
        if self.bucket_ms is not None:
            low, high = self.bucket_ms
            text += (f" (interpolated: the buckets put the target inside ({low:g}, {high:g}] ms, so between "
                     f"{self.fraction_low:.2%} and {self.fraction_high:.2%})")
        return text


def attained(summary: LatencySummary, target_ms: float, failed: int = 0) -> Attained | None:
    """The share of a window's requests at or under `target_ms`; None without samples or histogram."""
    if summary.samples_ms:
        within = float(sum(v <= target_ms for v in summary.samples_ms))
        return Attained(within, within, within, len(summary.samples_ms) + failed)
    histogram = summary.histogram
    if histogram is None or histogram.total <= 0:
        return None
    target_s, below, lower_s = target_ms / 1000.0, 0.0, 0.0
    total = histogram.total + failed
    for upper_s, count in zip(histogram.upper_s, histogram.counts, strict=True):
        if math.isclose(upper_s, target_s, rel_tol=1e-9) or upper_s > target_s:
            break
        below, lower_s = below + count, upper_s
    else:  # every observation is under the last edge, itself under the target
        return Attained(below, below, below, total)
    if math.isclose(upper_s, target_s, rel_tol=1e-9):  # an edge at the target: an exact count
        return Attained(below + count, below + count, below + count, total)
    share = 0.0 if math.isinf(upper_s) else (target_s - lower_s) / (upper_s - lower_s)
    return Attained(below + share * count, below, below + count, total, (lower_s * 1000.0, upper_s * 1000.0))


@dataclass(frozen=True)
class TargetResult:
    target: SLOTarget
    observed_ms: float | None
    required: float | None = None  # the share of requests that must be within the target (slo.attainment)
    attained: Attained | None = None  # None: no per-request evidence, the percentile alone decides

    @property
    def met(self) -> bool:
        if self.required is not None and self.attained is not None:
            return self.attained.fraction >= self.required
        return self.observed_ms is not None and self.observed_ms <= self.target.target_ms

    @property
    def ratio(self) -> float:
        """observed / target: above 1 is a violation; infinite when nothing was observed."""
        return float("inf") if self.observed_ms is None else self.observed_ms / self.target.target_ms


class SLOSpec(_Spec):
    """Latency targets the deployment must meet, and the throughput it must keep."""

    ttft: PercentileTargets | None = Field(default=None, description="Time to first token targets.")
    tpot: PercentileTargets | None = Field(
        default=None, description="Time per output token (inter-token latency) targets."
    )
    # to_camel would spell this e2E; the wire name is e2e.
    e2e: PercentileTargets | None = Field(default=None, alias="e2e", description="End-to-end request latency targets.")
    min_throughput: float | None = Field(
        default=None, gt=0, description="Output tokens per second the deployment must sustain, in total."
    )
    attainment: float | None = Field(
        default=None, gt=0, le=1, description=(
            "Fraction of requests that must be within each metric's loosest target (its highest percentile), "
            "counted request by request instead of read from an interpolated percentile: 0.99 with ttft.p99 500 "
            "asks that 99% of requests see TTFT <= 500 ms. That target is then judged by this fraction. Unset: "
            "the percentiles alone decide."))

    @model_validator(mode="after")
    def _some_target(self) -> Self:
        if self.ttft is None and self.tpot is None and self.e2e is None:
            raise ValueError("set at least one SLO target: ttft, tpot or e2e")
        return self

    def targets(self) -> list[SLOTarget]:
        found = []
        for metric in SLO_METRICS:
            spec: PercentileTargets | None = getattr(self, metric.value)
            if spec is None:
                continue
            found += [SLOTarget(metric, p, v) for p in PERCENTILES if (v := spec.at(p)) is not None]
        return found

    def required(self, target: SLOTarget) -> float | None:
        """The share of requests that must be within `target`: `attainment` for each metric's loosest target."""
        if self.attainment is None:
            return None
        loosest = [t for t in self.targets() if t.metric is target.metric][-1]  # percentiles ascend
        return self.attainment if target == loosest else None

    def evaluate(self, snapshot: MetricsSnapshot) -> list[TargetResult]:
        results = []
        for t in self.targets():
            summary, required = snapshot.latency(t.metric), self.required(t)
            found = None if required is None else attained(summary, t.target_ms, snapshot.num_failed_requests)
            results.append(TargetResult(t, summary.at(t.percentile), required, found))
        return results

    def throughput_met(self, snapshot: MetricsSnapshot) -> bool:
        return self.min_throughput is None or snapshot.generation_tokens_per_s >= self.min_throughput

    def is_met(self, snapshot: MetricsSnapshot) -> bool:
        return all(r.met for r in self.evaluate(snapshot)) and self.throughput_met(snapshot)
