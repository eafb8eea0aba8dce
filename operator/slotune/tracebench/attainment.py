"""Whether requests and windows meet an SLO.

A request meets the SLO when each of its latencies is within every target set for that metric (a P99 TTFT target of
2 s: its TTFT is at most 2 s), which is how "share of requests meeting the SLO" is counted (goodput's definition,
DistServe). A window meets it when its percentiles do (`SLOSpec.is_met` on the window's snapshot).
"""

from __future__ import annotations

from collections.abc import Sequence

from slotune.simulator.replica import SimulatedRequest
from slotune.simulator.window import tpot_ms
from slotune.slo import SLOSpec
from slotune.snapshot import LatencySummary, MetricsSnapshot, Source


def _strictest(targets: object) -> float | None:
    if targets is None:
        return None
    values = [v for v in (targets.p50, targets.p95, targets.p99) if v is not None]  # type: ignore[attr-defined]
    return min(values) if values else None


def request_meets(slo: SLOSpec, record: SimulatedRequest) -> bool:
    checks = ((_strictest(slo.ttft), (record.first_token_s - record.arrival_s) * 1000.0),
              (_strictest(slo.tpot), tpot_ms(record) if record.output_tokens > 1 else 0.0),
              (_strictest(slo.e2e), (record.finish_s - record.arrival_s) * 1000.0))
    return all(target is None or value <= target for target, value in checks)


def percentiles_met(slo: SLOSpec, records: Sequence[SimulatedRequest], window_s: float) -> bool:
    """The records' percentiles against the targets, as one window of them would be judged."""
    ms = 1000.0
    snapshot = MetricsSnapshot(
        source=Source.SIMULATOR, window_s=window_s, num_requests=len(records),
        ttft=LatencySummary.from_samples([(r.first_token_s - r.arrival_s) * ms for r in records]),
        tpot=LatencySummary.from_samples([tpot_ms(r) for r in records if r.output_tokens > 1]),
        e2e=LatencySummary.from_samples([(r.finish_s - r.arrival_s) * ms for r in records]),
    )
    return bool(records) and slo.is_met(snapshot)
