"""Raw per-window server readings, and the one place they turn into a `MetricsSnapshot`.

Both server-side sources (PromQL over a range, two direct scrapes differenced) first produce `WindowReadings`:
counter increases, gauge means and latency summaries over the window. Deriving rates and ratios from them happens
here only, so the two sources cannot disagree by construction of a ratio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from slotune.metrics.exposition import HistogramReading
from slotune.snapshot import Histogram, LatencyMetric, LatencySummary, MetricsSnapshot, Source


def summary_from_reading(reading: HistogramReading | None) -> LatencySummary:
    """Percentiles by PromQL's histogram_quantile rule (linear inside the bucket) from bucket counts."""
    if reading is None or reading.count <= 0:
        return LatencySummary()
    return LatencySummary.from_histogram(Histogram(reading.upper_s, reading.per_bucket()), sum_s=reading.sum_s)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


@dataclass(frozen=True)
class LengthTotals:
    """`_sum` and `_count` increases of a per-request length histogram (vLLM's `request_prompt_tokens`): both are
    observed when a request finishes, so their ratio is the mean length of the window's finished requests. The token
    counters count at prefill and at each step instead; divided by the finished count they misread the mean on any
    window where the load changes (a falling load's window reads prompts prefilled for requests that finish later)."""

    total: float
    count: float

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def __add__(self, other: LengthTotals) -> LengthTotals:
        """Two replicas' totals pooled."""
        return LengthTotals(self.total + other.total, self.count + other.count)


def _mean_length(totals: LengthTotals | None, tokens: float | None, finished: float) -> float | None:
    """The per-request histogram's mean where the engine exposes one, else the token counter over finished requests."""
    measured = totals.mean if totals is not None else None
    return measured if measured is not None else _ratio(tokens, finished)


@dataclass(frozen=True)
class WindowReadings:
    """Increases of counters over `window_s`, means of gauges, and latency summaries; None = not exposed."""

    window_s: float
    latencies: Mapping[LatencyMetric, LatencySummary] = field(default_factory=dict)
    num_requests: float = 0.0
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_hit_rate: float | None = None  # engines with only a gauge (SGLang)
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    spec_accept_length: float | None = None  # engines with only a gauge (SGLang)
    num_running_mean: float | None = None
    num_waiting_mean: float | None = None
    kv_cache_usage_mean: float | None = None
    num_preemptions: float | None = None
    prompt_lengths: LengthTotals | None = None
    generation_lengths: LengthTotals | None = None

    def to_snapshot(self, source: Source) -> MetricsSnapshot:
        latency = self.latencies.get
        hit_rate = _ratio(self.prefix_cache_hits, self.prefix_cache_queries)
        accept_length = self.spec_accept_length
        if self.spec_accepted_tokens is not None and self.spec_drafts:
            accept_length = 1.0 + self.spec_accepted_tokens / self.spec_drafts  # docs/facts.md#metrics
        return MetricsSnapshot(
            source=source, window_s=self.window_s, num_requests=round(self.num_requests),
            ttft=latency(LatencyMetric.TTFT, LatencySummary()), tpot=latency(LatencyMetric.TPOT, LatencySummary()),
            itl=latency(LatencyMetric.ITL, LatencySummary()), e2e=latency(LatencyMetric.E2E, LatencySummary()),
            queue=latency(LatencyMetric.QUEUE, LatencySummary()),
            prefill=latency(LatencyMetric.PREFILL, LatencySummary()),
            decode=latency(LatencyMetric.DECODE, LatencySummary()),
            request_rate_per_s=self.num_requests / self.window_s,
            prompt_tokens_per_s=(self.prompt_tokens or 0.0) / self.window_s,
            generation_tokens_per_s=(self.generation_tokens or 0.0) / self.window_s,
            mean_prompt_tokens=_mean_length(self.prompt_lengths, self.prompt_tokens, self.num_requests),
            mean_generation_tokens=_mean_length(self.generation_lengths, self.generation_tokens, self.num_requests),
            prefix_cache_hit_rate=hit_rate if hit_rate is not None else self.prefix_cache_hit_rate,
            spec_acceptance_rate=_ratio(self.spec_accepted_tokens, self.spec_draft_tokens),
            spec_mean_acceptance_length=accept_length,
            num_running_mean=self.num_running_mean, num_waiting_mean=self.num_waiting_mean,
            kv_cache_usage=self.kv_cache_usage_mean, num_preemptions=self.num_preemptions or 0.0,
        )


class UnavailableReason(StrEnum):
    UNREACHABLE = "unreachable"  # Prometheus or a /metrics endpoint did not answer
    NOT_EXPOSED = "not-exposed"  # the endpoint answered without the engine's metrics (wrong engine or selector)
    TOO_FEW_SAMPLES = "too-few-samples"  # fewer finished requests in the window than asked for


class MetricsUnavailable(Exception):
    """No trustworthy snapshot for this window; the tuner keeps its config and sets MetricsAvailable=False."""

    def __init__(self, reason: UnavailableReason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message


def require_samples(readings: WindowReadings, min_requests: int) -> WindowReadings:
    if readings.num_requests < min_requests:
        raise MetricsUnavailable(
            UnavailableReason.TOO_FEW_SAMPLES,
            f"{readings.num_requests:.0f} requests finished in {readings.window_s:.0f} s, need {min_requests}",
        )
    return readings
