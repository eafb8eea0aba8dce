"""Turn simulated request timelines and replica counters into a `MetricsSnapshot` (source: simulator).

Per-request latencies follow the runtime's metric definitions (docs/facts.md#metrics): TTFT from arrival to first token,
queue until first scheduled, prefill from first scheduled to first token, decode from first token to last, TPOT as
(e2e - ttft) / (output_tokens - 1). Inter-token latency has one observation per output event; it is kept as a
histogram on the standard ITL buckets with percentiles computed exactly from the weighted gaps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slotune.knobs import RuntimeConfig
from slotune.simulator.replica import ReplicaResult, SimulatedRequest
from slotune.snapshot import Histogram, LatencySummary, MetricsSnapshot, Source
from slotune.workload import PlannedRequest

ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10, 20, 40, 80,
                 float("inf"))


def build_snapshot(results: Sequence[ReplicaResult], requests: Sequence[PlannedRequest], config: RuntimeConfig,
                   spec_acceptance_rate: float) -> MetricsSnapshot:
    records = [r for result in results for r in result.records]
    records.sort(key=lambda r: r.arrival_s)
    start_s = requests[0].arrival_s if requests else 0.0
    end_s = max((r.finish_s for r in records), default=start_s)
    window_s = max(end_s - start_s, 1e-9)
    decoded = [r for r in records if r.output_tokens > 1]
    # Offered load is arrivals over the arrival span: an overloaded window drains long after the last arrival.
    arrival_span_s = max(requests[-1].arrival_s - start_s, 1e-9) if len(requests) > 1 else window_s
    ms = 1000.0
    return MetricsSnapshot(
        source=Source.SIMULATOR, window_s=window_s, num_requests=len(records),
        ttft=LatencySummary.from_samples([(r.first_token_s - r.arrival_s) * ms for r in records]),
        tpot=LatencySummary.from_samples([tpot_ms(r) for r in decoded]),
        itl=_itl_summary([gap for result in results for gap in result.itl_gaps_s]),
        e2e=LatencySummary.from_samples([(r.finish_s - r.arrival_s) * ms for r in records]),
        queue=LatencySummary.from_samples([(r.first_scheduled_s - r.arrival_s) * ms for r in records]),
        prefill=LatencySummary.from_samples([(r.first_token_s - r.first_scheduled_s) * ms for r in records]),
        decode=LatencySummary.from_samples([(r.finish_s - r.first_token_s) * ms for r in records]),
        request_rate_per_s=len(requests) / arrival_span_s,
        prompt_tokens_per_s=sum(r.prompt_tokens for r in records) / window_s,
        generation_tokens_per_s=sum(r.output_tokens for r in records) / window_s,
        mean_prompt_tokens=float(np.mean([r.prompt_tokens for r in records])) if records else None,
        mean_generation_tokens=float(np.mean([r.output_tokens for r in records])) if records else None,
        **_gauges(results, window_s, config, spec_acceptance_rate),
    )


def tpot_ms(record: SimulatedRequest) -> float:
    return (record.finish_s - record.first_token_s) / (record.output_tokens - 1) * 1000.0


def _gauges(results: Sequence[ReplicaResult], window_s: float, config: RuntimeConfig,
            spec_acceptance_rate: float) -> dict[str, float | int | None]:
    replicas = max(len(results), 1)
    queries = sum(r.prefix_query_tokens for r in results)
    capacity = sum(r.kv_capacity_tokens for r in results) or 1
    speculating = config.speculative is not None
    drafts = config.speculative.num_speculative_tokens if config.speculative else 0
    accepted = sum(spec_acceptance_rate ** i for i in range(1, drafts + 1))  # expected accepted tokens per draft
    return {
        "prefix_cache_hit_rate": sum(r.prefix_hit_tokens for r in results) / queries if queries else None,
        "spec_acceptance_rate": accepted / drafts if speculating else None,
        "spec_mean_acceptance_length": 1 + accepted if speculating else None,
        "num_running_mean": sum(r.running_seq_s for r in results) / window_s / replicas,
        "num_waiting_mean": sum(r.waiting_seq_s for r in results) / window_s / replicas,
        "kv_cache_usage": min(1.0, sum(r.kv_token_s for r in results) / window_s / capacity),
        "num_preemptions": float(sum(r.num_preemptions for r in results)),
        "num_failed_requests": sum(r.num_failed for r in results),
    }


def _itl_summary(gaps: Sequence[tuple[float, int]]) -> LatencySummary:
    if not gaps:
        return LatencySummary()
    values = np.array([g for g, _ in gaps]) * 1000.0
    weights = np.array([w for _, w in gaps], dtype=float)
    order = np.argsort(values)
    values, weights = values[order], weights[order]
    cumulative = np.cumsum(weights) / weights.sum()

    def at(q: float) -> float:
        return float(values[min(np.searchsorted(cumulative, q), len(values) - 1)])

    counts = np.zeros(len(ITL_BUCKETS_S))
    np.add.at(counts, np.searchsorted(ITL_BUCKETS_S, values / 1000.0), weights)
    histogram = Histogram(ITL_BUCKETS_S, tuple(float(c) for c in counts))
    return LatencySummary(p50_ms=at(0.5), p95_ms=at(0.95), p99_ms=at(0.99),
                          mean_ms=float(np.average(values, weights=weights)), count=int(weights.sum()),
                          histogram=histogram)
