"""Client-side results of a benchmark: percentiles with bootstrap confidence intervals, goodput, SLO attainment.

`summarize` turns request records into a `BenchSummary` whose JSON keys follow vLLM's benchmark_serving
(mean_ttft_ms, median_ttft_ms, p99_ttft_ms, request_throughput, ...), plus `*_ci_ms` bounds and SLO results.
Failed and rejected requests count as violations: they lower attainment and goodput, and for the SLO verdict they
enter the percentiles as infinitely slow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from slotune.loadgen.record import RequestRecord
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, LatencySummary, MetricsSnapshot, Source

REPORTED_PERCENTILES = (50, 90, 95, 99)
BOOTSTRAP_RESAMPLES = 1000


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float


def bootstrap_percentile(samples: Sequence[float] | np.ndarray, percentile: float, confidence: float = 0.95,
                         num_resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Estimate | None:
    """Percentile with a bootstrap percentile-method CI (Efron & Tibshirani 1993, ch. 13); None without samples.

    Resampled in chunks so memory stays at ~8 MB whatever the sample count.
    """
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        return None
    rng = np.random.default_rng(seed)
    chunk = max(1, 1_000_000 // values.size)
    estimates = []
    for start in range(0, num_resamples, chunk):
        draws = rng.integers(0, values.size, (min(chunk, num_resamples - start), values.size))
        estimates.append(np.percentile(values[draws], percentile, axis=1))
    spread = np.concatenate(estimates)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(spread, [tail, 100 - tail])
    return Estimate(float(np.percentile(values, percentile)), float(low), float(high))


@dataclass(frozen=True)
class MetricStats:
    """vLLM-style statistics of one latency metric, in milliseconds."""

    mean_ms: float | None
    median_ms: float | None
    std_ms: float | None
    percentiles_ms: dict[int, Estimate]

    @classmethod
    def of(cls, samples_ms: Sequence[float], seed: int = 0) -> MetricStats:
        values = np.asarray(samples_ms, dtype=float)
        if values.size == 0:
            return cls(None, None, None, {})
        found = {p: bootstrap_percentile(values, p, seed=seed + p) for p in REPORTED_PERCENTILES}
        return cls(float(values.mean()), float(np.median(values)), float(values.std()),
                   {p: e for p, e in found.items() if e is not None})

    def json(self, key: str) -> dict[str, float | list[float] | None]:
        out: dict[str, float | list[float] | None] = {
            f"mean_{key}_ms": self.mean_ms, f"median_{key}_ms": self.median_ms, f"std_{key}_ms": self.std_ms,
        }
        for p, estimate in self.percentiles_ms.items():
            out[f"p{p}_{key}_ms"] = estimate.value
            out[f"p{p}_{key}_ci_ms"] = [estimate.low, estimate.high]
        return out


def request_latencies_ms(records: Sequence[RequestRecord], metric: LatencyMetric) -> list[float]:
    """Per-request samples of TTFT, TPOT or E2E; ITL has one sample per token gap."""
    done = [r for r in records if r.ok]
    if metric == LatencyMetric.TTFT:
        return [r.ttft_s * 1000 for r in done if r.ttft_s is not None]
    if metric == LatencyMetric.TPOT:
        return [t * 1000 for r in done if (t := r.tpot_s) is not None]
    if metric == LatencyMetric.E2E:
        return [r.e2e_s * 1000 for r in done if r.e2e_s is not None]
    if metric == LatencyMetric.ITL:
        return [gap * 1000 for r in done for gap in r.itl_s]
    raise ValueError(f"the client does not measure {metric.value}")


CLIENT_METRICS = {"ttft": LatencyMetric.TTFT, "tpot": LatencyMetric.TPOT, "itl": LatencyMetric.ITL,
                  "e2el": LatencyMetric.E2E}  # vLLM's JSON key -> metric


@dataclass(frozen=True)
class SLOResult:
    name: str
    target_ms: float
    observed_ms: float  # failures counted as infinitely slow
    met: bool


@dataclass(frozen=True)
class BenchSummary:
    duration_s: float
    completed: int
    failed: int
    rejected: int
    total_input_tokens: int
    total_output_tokens: int
    metrics: dict[str, MetricStats]  # keyed by vLLM's short names: ttft, tpot, itl, e2el
    slo_attainment: float | None = None
    good_requests: int | None = None
    slo_results: tuple[SLOResult, ...] = field(default_factory=tuple)

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    def json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "duration": self.duration_s, "completed": self.completed, "failed": self.failed,
            "rejected": self.rejected, "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens, "request_throughput": self.request_throughput,
            "output_throughput": self.total_output_tokens / self.duration_s if self.duration_s > 0 else 0.0,
            "total_token_throughput": (self.total_input_tokens + self.total_output_tokens) / self.duration_s
            if self.duration_s > 0 else 0.0,
        }
        for key, stats in self.metrics.items():
            out |= stats.json(key)
        if self.good_requests is not None:
            out["request_goodput"] = self.good_requests / self.duration_s if self.duration_s > 0 else 0.0
            out["slo_attainment"] = self.slo_attainment
            out["slo_met"] = all(r.met for r in self.slo_results)
            out["slo_results"] = [r.__dict__ for r in self.slo_results]
        return out


def per_request_bounds_ms(slo: SLOSpec) -> dict[LatencyMetric, float]:
    """Per-request bound of each metric: its tail target (highest percentile given), as vLLM's --goodput takes."""
    bounds: dict[LatencyMetric, float] = {}
    for target in slo.targets():
        bounds[target.metric] = target.target_ms  # targets() lists percentiles ascending: the last one wins
    return bounds


def meets_slo(record: RequestRecord, bounds_ms: dict[LatencyMetric, float]) -> bool:
    if not record.ok:
        return False
    observed = {LatencyMetric.TTFT: record.ttft_s, LatencyMetric.TPOT: record.tpot_s, LatencyMetric.E2E: record.e2e_s}
    return all(observed[m] is None or observed[m] * 1000 <= bound for m, bound in bounds_ms.items())


def slo_results(records: Sequence[RequestRecord], slo: SLOSpec) -> tuple[SLOResult, ...]:
    results = []
    for target in slo.targets():
        samples = request_latencies_ms(records, target.metric)
        num_failed = sum(not r.ok for r in records)
        values = np.asarray(samples + [np.inf] * num_failed)  # a failure is slower than any target
        observed = float(np.percentile(values, target.percentile, method="higher")) if values.size else np.inf
        results.append(SLOResult(target.name, target.target_ms, observed, observed <= target.target_ms))
    return tuple(results)


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: SLOSpec | None = None,
              seed: int = 0) -> BenchSummary:
    """Statistics over the measured (non-warm-up) records."""
    measured = [r for r in records if not r.warmup]
    done = [r for r in measured if r.ok]
    metrics = {key: MetricStats.of(request_latencies_ms(measured, m), seed) for key, m in CLIENT_METRICS.items()}
    summary = BenchSummary(
        duration_s=duration_s, completed=len(done), failed=len(measured) - len(done),
        rejected=sum(r.rejected for r in measured), total_input_tokens=sum(r.prompt_tokens for r in done),
        total_output_tokens=sum(r.output_tokens for r in done), metrics=metrics,
    )
    if slo is None:
        return summary
    bounds = per_request_bounds_ms(slo)
    good = sum(meets_slo(r, bounds) for r in measured)
    return BenchSummary(
        **{**summary.__dict__, "good_requests": good,
           "slo_attainment": good / len(measured) if measured else None, "slo_results": slo_results(measured, slo)},
    )


def client_snapshot(records: Sequence[RequestRecord], duration_s: float) -> MetricsSnapshot:
    """The client's view as a `MetricsSnapshot`, so the tuner can verify against client-side samples."""
    measured = [r for r in records if not r.warmup]
    done = [r for r in measured if r.ok]
    summaries = {m: LatencySummary.from_samples(request_latencies_ms(measured, m)) for m in CLIENT_METRICS.values()}
    return MetricsSnapshot(
        source=Source.CLIENT, window_s=duration_s, num_requests=len(done),
        ttft=summaries[LatencyMetric.TTFT], tpot=summaries[LatencyMetric.TPOT], itl=summaries[LatencyMetric.ITL],
        e2e=summaries[LatencyMetric.E2E], request_rate_per_s=len(done) / duration_s,
        prompt_tokens_per_s=sum(r.prompt_tokens for r in done) / duration_s,
        generation_tokens_per_s=sum(r.output_tokens for r in done) / duration_s,
        mean_prompt_tokens=float(np.mean([r.prompt_tokens for r in done])) if done else None,
        mean_generation_tokens=float(np.mean([r.output_tokens for r in done])) if done else None,
        num_failed_requests=len(measured) - len(done),
    )
