"""One window of a continuous simulation as the `MetricsSnapshot` Prometheus would give for it.

Latencies are those of the requests that finished in the window (a histogram is observed when a request ends);
`request_rate_per_s` counts finished requests per second, as `rate(vllm:request_success)` does, and
`arrival_rate_per_s` the requests that arrived. Gauges are per serving replica, averaged over the window's serving
replica-time: `num_running_mean`, `num_waiting_mean`, and `num_waiting_end`, the queue per serving replica when the
window ended (requests held at the gateway while nothing served count as waiting).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from slotune.simulator.continuous.fleet import Fleet, FleetMember
from slotune.simulator.continuous.replica import ReplicaCounters
from slotune.simulator.replica import ReplicaResult, SimulatedRequest
from slotune.simulator.window import build_snapshot
from slotune.snapshot import MetricsSnapshot
from slotune.workload import PlannedRequest


@dataclass(frozen=True)
class WindowTotals:
    """Every replica's running totals when a window began, by its place in the fleet."""

    counters: tuple[ReplicaCounters, ...]
    itl: tuple[dict[float, int], ...]

    @classmethod
    def of(cls, fleet: Fleet) -> WindowTotals:
        members = fleet.members
        return cls(tuple(m.replica.counters() for m in members), tuple(dict(m.replica.itl) for m in members))


def window_snapshot(fleet: Fleet, before: WindowTotals, arrivals: Sequence[PlannedRequest], start_s: float,
                    end_s: float, num_held: int, spec_acceptance_rate: float
                    ) -> tuple[MetricsSnapshot, list[SimulatedRequest]]:
    window_s = end_s - start_s
    results = [_result(m, before, i) for i, m in enumerate(fleet.members)]
    finished = sorted((r for result in results for r in result.records), key=lambda r: r.finish_s)
    base = build_snapshot(results, list(arrivals), fleet.config, spec_acceptance_rate)
    serving_s = sum(_overlap_s(m, start_s, end_s) for m in fleet.members)
    replicas = serving_s / window_s
    per_replica = 1.0 / (window_s * replicas) if replicas > 0 else None
    serving_now = [m for m in fleet.members if m.serving(end_s)]
    waiting_end = sum(len(m.replica.waiting) for m in serving_now) + num_held
    capacity = fleet.deployment.kv_capacity_tokens(fleet.config)
    snapshot = replace(
        base, window_s=window_s, num_requests=len(finished), request_rate_per_s=len(finished) / window_s,
        arrival_rate_per_s=len(arrivals) / window_s,
        prompt_tokens_per_s=sum(r.prompt_tokens for r in finished) / window_s,
        generation_tokens_per_s=sum(r.output_tokens for r in finished) / window_s,
        num_running_mean=None if per_replica is None else sum(r.running_seq_s for r in results) * per_replica,
        num_waiting_mean=None if per_replica is None else sum(r.waiting_seq_s for r in results) * per_replica,
        kv_cache_usage=None if per_replica is None else min(1.0, sum(r.kv_token_s for r in results) * per_replica
                                                            / capacity),
        num_waiting_end=waiting_end / max(len(serving_now), 1),
    )
    return snapshot, finished


def _result(member: FleetMember, before: WindowTotals, index: int) -> ReplicaResult:
    replica = member.replica
    now = replica.counters()
    was = before.counters[index] if index < len(before.counters) else ReplicaCounters(0, 0, 0.0, 0.0, 0.0, 0.0, 0,
                                                                                       0, 0)
    old_itl = before.itl[index] if index < len(before.itl) else {}
    itl = tuple((gap, count - old_itl.get(gap, 0)) for gap, count in sorted(replica.itl.items())
                if count > old_itl.get(gap, 0))
    return ReplicaResult(tuple(replica.records[was.num_records:]), now.num_failed - was.num_failed, itl,
                         now.busy_s - was.busy_s, now.running_seq_s - was.running_seq_s,
                         now.waiting_seq_s - was.waiting_seq_s, now.kv_token_s - was.kv_token_s, replica.capacity,
                         now.num_preemptions - was.num_preemptions,
                         now.prefix_query_tokens - was.prefix_query_tokens,
                         now.prefix_hit_tokens - was.prefix_hit_tokens)


def _overlap_s(member: FleetMember, start_s: float, end_s: float) -> float:
    """Seconds of [start_s, end_s] the member served (ready, not yet released; draining counts: it still serves)."""
    serve_end_s = member.released_at_s if member.released_at_s is not None else end_s
    return max(0.0, min(end_s, serve_end_s) - max(start_s, member.ready_at_s))
