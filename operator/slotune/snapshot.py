"""What one measurement window says about a serving deployment.

`MetricsSnapshot` is the single currency between measurement (Prometheus, a direct `/metrics` scrape, the client-side
load generator, the simulator) and the tuner. Every latency carries its percentiles in milliseconds and, where the
source has them, the raw evidence (samples or histogram buckets) so verification can put confidence intervals on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np


class LatencyMetric(StrEnum):
    TTFT = "ttft"
    TPOT = "tpot"
    ITL = "itl"
    E2E = "e2e"
    QUEUE = "queue"
    PREFILL = "prefill"
    DECODE = "decode"


class Source(StrEnum):
    PROMETHEUS = "prometheus"
    SCRAPE = "scrape"
    CLIENT = "client"
    SIMULATOR = "simulator"


@dataclass(frozen=True)
class Histogram:
    """Cumulative-free histogram of one window: counts[i] observations fell in (upper_s[i-1], upper_s[i]]."""

    upper_s: tuple[float, ...]  # bucket upper bounds in seconds, ascending, last may be +inf
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        return float(sum(self.counts))

    def quantile_s(self, q: float) -> float | None:
        """Linear interpolation inside the bucket, as PromQL's histogram_quantile does."""
        total = self.total
        if total <= 0:
            return None
        rank = q * total
        cumulative, lower = 0.0, 0.0
        for upper, count in zip(self.upper_s, self.counts, strict=True):
            if count > 0 and cumulative + count >= rank:
                if np.isinf(upper):
                    return lower
                return lower + (upper - lower) * (rank - cumulative) / count
            cumulative += count
            if not np.isinf(upper):
                lower = upper
        return lower

    def bucket_of(self, value_s: float) -> tuple[float, float]:
        """The (lower, upper] bounds of the bucket that holds value_s."""
        lower = 0.0
        for upper in self.upper_s:
            if value_s <= upper:
                return lower, upper
            lower = upper
        return lower, float("inf")


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles of one latency metric over a window, in milliseconds, with the evidence behind them."""

    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    count: int = 0
    samples_ms: tuple[float, ...] | None = None
    histogram: Histogram | None = None

    def at(self, percentile: int) -> float | None:
        """The value at percentile 50, 95 or 99."""
        return {50: self.p50_ms, 95: self.p95_ms, 99: self.p99_ms}[percentile]

    @classmethod
    def from_samples(cls, samples_ms: list[float] | tuple[float, ...] | np.ndarray) -> LatencySummary:
        values = np.asarray(samples_ms, dtype=float)
        if values.size == 0:
            return cls()
        p50, p95, p99 = np.percentile(values, [50, 95, 99])
        return cls(
            p50_ms=float(p50), p95_ms=float(p95), p99_ms=float(p99), mean_ms=float(values.mean()),
            count=int(values.size), samples_ms=tuple(float(v) for v in values),
        )

    @classmethod
    def from_histogram(cls, histogram: Histogram, sum_s: float | None = None) -> LatencySummary:
        def ms(q: float) -> float | None:
            value = histogram.quantile_s(q)
            return None if value is None else value * 1000.0

        total = histogram.total
        mean = None if sum_s is None or total <= 0 else sum_s / total * 1000.0
        return cls(p50_ms=ms(0.5), p95_ms=ms(0.95), p99_ms=ms(0.99), mean_ms=mean, count=round(total),
                   histogram=histogram)

    def pooled(self, other: LatencySummary) -> LatencySummary:
        """Both windows as one: samples in arrival order (self first), or summed bucket counts; self when the
        two cannot be pooled (different evidence or bucket bounds)."""
        if self.samples_ms and other.samples_ms:
            return LatencySummary.from_samples((*self.samples_ms, *other.samples_ms))
        mine, theirs = self.histogram, other.histogram
        if mine is not None and theirs is not None and mine.upper_s == theirs.upper_s:
            counts = tuple(a + b for a, b in zip(mine.counts, theirs.counts, strict=True))
            summed = LatencySummary.from_histogram(Histogram(mine.upper_s, counts))
            total = self.count + other.count
            known = self.mean_ms is not None and other.mean_ms is not None and total > 0
            mean = (self.mean_ms * self.count + other.mean_ms * other.count) / total if known else None  # type: ignore[operator]
            return replace(summed, mean_ms=mean)
        return self


@dataclass(frozen=True)
class MetricsSnapshot:
    """One window of server-side (or client-side, or simulated) measurements of a deployment."""

    source: Source
    window_s: float
    num_requests: int
    ttft: LatencySummary = field(default_factory=LatencySummary)
    tpot: LatencySummary = field(default_factory=LatencySummary)
    itl: LatencySummary = field(default_factory=LatencySummary)
    e2e: LatencySummary = field(default_factory=LatencySummary)
    queue: LatencySummary = field(default_factory=LatencySummary)
    prefill: LatencySummary = field(default_factory=LatencySummary)
    decode: LatencySummary = field(default_factory=LatencySummary)
    request_rate_per_s: float = 0.0
    prompt_tokens_per_s: float = 0.0
    generation_tokens_per_s: float = 0.0
    mean_prompt_tokens: float | None = None
    mean_generation_tokens: float | None = None
    prefix_cache_hit_rate: float | None = None  # hits / queries, in tokens
    spec_acceptance_rate: float | None = None  # accepted / drafted tokens
    spec_mean_acceptance_length: float | None = None  # 1 + accepted / drafts
    # Per replica, as each engine batches and queues (what max_num_seqs bounds); counters and rates are totals.
    num_running_mean: float | None = None
    num_waiting_mean: float | None = None
    kv_cache_usage: float | None = None  # 0..1, mean over the window
    num_preemptions: float = 0.0
    num_failed_requests: int = 0  # rejected (429) or errored; count as SLO violations
    arrival_rate_per_s: float | None = None  # requests arriving per second (request_rate_per_s counts finished ones)
    num_waiting_end: float | None = None  # per replica, waiting when the window ended (num_waiting_mean's sibling)

    def latency(self, metric: LatencyMetric) -> LatencySummary:
        return getattr(self, metric.value)

    @property
    def mean_decode_context_tokens(self) -> float:
        """The context a decoding sequence attends to on average: its prompt and half its output."""
        return (self.mean_prompt_tokens or 0.0) + (self.mean_generation_tokens or 0.0) / 2
