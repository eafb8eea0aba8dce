"""Each baseline's decision rule, on hand-made windows: what replica count it asks for and when."""

from __future__ import annotations

import pytest

from slotune.slo import SLOSpec
from slotune.snapshot import LatencySummary, MetricsSnapshot, Source
from slotune.tracebench.baselines import (
    FleetView,
    PredictivePlanner,
    QueueAutoscaler,
    SaturationAutoscaler,
    StaticPool,
)
from slotune.tracebench.sizing import busiest_start_s
from slotune.workload import PlannedRequest

SLO = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})


def window(waiting: float = 0.0, arrivals: float = 0.0, ttft_ms: float = 100.0, tpot_ms: float = 20.0
           ) -> MetricsSnapshot:
    return MetricsSnapshot(Source.SIMULATOR, 60.0, 100, ttft=LatencySummary.from_samples([ttft_ms] * 100),
                           tpot=LatencySummary.from_samples([tpot_ms] * 100), num_waiting_mean=waiting,
                           arrival_rate_per_s=arrivals)


def view(snapshot: MetricsSnapshot, ordered: int = 4, starting: int = 0, max_replicas: int = 10) -> FleetView:
    return FleetView(snapshot, ordered, ordered - starting, starting, max_replicas, 60.0)


def test_static_pool_never_moves() -> None:
    assert StaticPool(3).replicas(view(window(waiting=50), ordered=3)) == 3


def test_queue_autoscaler_scales_up_in_proportion_and_down_after_five_calm_minutes() -> None:
    scaler = QueueAutoscaler(target_waiting=2.0)
    assert scaler.replicas(view(window(waiting=5.0), ordered=4)) == 10  # ceil(4 x 5 / 2)
    assert scaler.replicas(view(window(waiting=2.1), ordered=4)) == 4  # within HPA's 10% tolerance
    assert scaler.replicas(view(window(waiting=40.0), ordered=4)) == 10  # bounded by max replicas
    calm = [scaler.replicas(view(window(waiting=0.0), ordered=4 - max(0, i - 4))) for i in range(7)]
    assert calm == [4, 4, 4, 4, 3, 2, 1]  # 300 s at or under the target, then one replica a window
    assert scaler.replicas(view(window(waiting=0.0), ordered=1)) == 1  # never below one


def test_saturation_autoscaler_reads_p90_over_targets() -> None:
    scaler = SaturationAutoscaler(SLO)
    assert scaler.saturation(window(ttft_ms=1000, tpot_ms=95)) == pytest.approx(0.95)
    assert scaler.replicas(view(window(ttft_ms=3000), ordered=4)) == 7  # ceil(4 x 1.5 / 0.9)
    assert scaler.replicas(view(window(ttft_ms=3000), ordered=5, starting=1)) == 5  # waits for its start-up
    downs = [scaler.replicas(view(window(ttft_ms=200, tpot_ms=20), ordered=4)) for _ in range(3)]
    assert downs == [4, 4, 3]  # three calm windows in a row, then one fewer
    assert scaler.replicas(view(window(ttft_ms=1200), ordered=4)) == 4  # between the thresholds: hold


def test_predictive_planner_extrapolates_the_recent_trend() -> None:
    planner = PredictivePlanner(capacity_per_replica_per_s=2.0)
    asked = [planner.replicas(view(window(arrivals=rate))) for rate in (4.0, 5.0, 6.0, 7.0)]
    assert asked[0] == 2  # 4 req/s over 2 per replica
    assert planner.predict() == pytest.approx(8.0)  # the line through 4, 5, 6, 7 one window ahead
    assert asked[-1] == 4
    falling = [planner.replicas(view(window(arrivals=rate))) for rate in (3.0, 1.0, 1.0, 1.0, 1.0)]
    assert falling[-1] == 1  # it follows the load down once the trend flattens
    assert planner.rates and len(planner.rates) == planner.history


def test_busiest_stretch_is_found() -> None:
    times = [float(t) for t in range(0, 600, 10)] + [700 + t / 10 for t in range(100)] + [1200.0]
    requests = [PlannedRequest(t, 10, 10, None, 0) for t in times]
    assert busiest_start_s(requests, 300.0) == pytest.approx(410.0)  # the first stretch holding the whole burst
