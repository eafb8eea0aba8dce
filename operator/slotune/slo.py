"""Latency SLO targets and the one rule for whether a window meets them.

`SLOSpec` is the `spec.slo` block of a TunedModel (camelCase on the wire) and the yardstick of the load generator,
the tuner and the status. Targets are in milliseconds at P50/P95/P99 of TTFT, TPOT and end-to-end latency.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from slotune.snapshot import LatencyMetric, MetricsSnapshot

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
class TargetResult:
    target: SLOTarget
    observed_ms: float | None

    @property
    def met(self) -> bool:
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
    attainment: float = Field(
        default=0.99, gt=0, le=1, description="Fraction of requests that must meet every target (goodput)."
    )

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

    def evaluate(self, snapshot: MetricsSnapshot) -> list[TargetResult]:
        return [TargetResult(t, snapshot.latency(t.metric).at(t.percentile)) for t in self.targets()]

    def throughput_met(self, snapshot: MetricsSnapshot) -> bool:
        return self.min_throughput is None or snapshot.generation_tokens_per_s >= self.min_throughput

    def is_met(self, snapshot: MetricsSnapshot) -> bool:
        return all(r.met for r in self.evaluate(snapshot)) and self.throughput_met(snapshot)
