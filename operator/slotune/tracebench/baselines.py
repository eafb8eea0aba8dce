"""The replica autoscalers people run, each as its decision rule: what replica count to ask for after a window.

None sees the future: each reads only the window that just ended and its own memory of earlier ones.

- `StaticPool`: a fixed pool (sized by the benchmark for the trace's busiest five minutes, `sizing.py`).
- `QueueAutoscaler`: Kubernetes' HPA (as KEDA drives it) on vLLM's `num_requests_waiting`, averaged per replica.
  Up: desired = ceil(current x metric / target) when the metric is above the target beyond HPA's 10% tolerance
  (k8s docs "Horizontal Pod Autoscaling", algorithm details). Down: one replica a window once the metric stayed at or
  under the target for 300 s (HPA's default scale-down stabilisation, with a one-pod-per-minute scale-down policy:
  HPA's formula alone would ask for zero replicas whenever the queue is empty and collapse the pool to its minimum). The
  window's mean queue stands in for HPA's 15-second samples of the gauge.
- `SaturationAutoscaler`: llm-d's SLO-driven saturation scaling: the P90 TTFT and TPOT of the window over their
  targets; above `up_ratio` it adds replicas in proportion (one at least), below `down_ratio` for `down_windows`
  windows in a row it removes one; it waits while a replica it ordered is still starting.
- `PredictivePlanner`: Dynamo's planner: next interval's arrival rate predicted from recent windows (a least-squares
  line through the last `history` windows, evaluated one interval ahead, never below the latest), replicas =
  ceil(predicted rate / profiled per-replica capacity).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from slotune.slo import SLOSpec
from slotune.snapshot import MetricsSnapshot

HPA_TOLERANCE = 0.1
HPA_DOWNSCALE_STABILIZATION_S = 300.0


@dataclass(frozen=True)
class FleetView:
    """What a controller reads after a window: the window and the fleet's state when it ended."""

    window: MetricsSnapshot
    ordered: int  # replicas asked for (serving and starting)
    num_ready: int
    num_starting: int
    max_replicas: int
    window_s: float


def _bounded(replicas: int, view: FleetView) -> int:
    return max(1, min(view.max_replicas, replicas))


@dataclass
class StaticPool:
    size: int

    def replicas(self, view: FleetView) -> int:
        return self.size


@dataclass
class QueueAutoscaler:
    target_waiting: float  # num_requests_waiting per replica
    calm_s: float = 0.0  # how long the queue has stayed at or under the target

    def replicas(self, view: FleetView) -> int:
        waiting = view.window.num_waiting_mean or 0.0
        current = view.ordered
        if waiting > self.target_waiting * (1 + HPA_TOLERANCE):
            self.calm_s = 0.0
            return _bounded(math.ceil(current * waiting / self.target_waiting), view)
        self.calm_s = self.calm_s + view.window_s if waiting <= self.target_waiting else 0.0
        if self.calm_s >= HPA_DOWNSCALE_STABILIZATION_S:
            return _bounded(current - 1, view)
        return current


@dataclass
class SaturationAutoscaler:
    slo: SLOSpec
    up_ratio: float = 0.9
    down_ratio: float = 0.5
    down_windows: int = 3
    calm: int = 0

    def saturation(self, window: MetricsSnapshot) -> float:
        ratios = []
        for summary, targets in ((window.ttft, self.slo.ttft), (window.tpot, self.slo.tpot)):
            if targets is None or not summary.samples_ms:
                continue
            target = min(v for v in (targets.p50, targets.p95, targets.p99) if v is not None)
            ratios.append(float(np.percentile(summary.samples_ms, 90)) / target)
        return max(ratios, default=0.0)

    def replicas(self, view: FleetView) -> int:
        ratio = self.saturation(view.window)
        if ratio > self.up_ratio:
            self.calm = 0
            if view.num_starting:
                return view.ordered
            return _bounded(max(view.ordered + 1, math.ceil(view.ordered * ratio / self.up_ratio)), view)
        self.calm = self.calm + 1 if ratio < self.down_ratio else 0
        if self.calm >= self.down_windows and not view.num_starting:
            self.calm = 0
            return _bounded(view.ordered - 1, view)
        return view.ordered


@dataclass
class PredictivePlanner:
    capacity_per_replica_per_s: float
    history: int = 5
    rates: deque[float] = field(default_factory=deque)

    def predict(self) -> float:
        rates = np.array(self.rates)
        if len(rates) < 2:
            return float(rates[-1]) if len(rates) else 0.0
        slope, intercept = np.polyfit(np.arange(len(rates)), rates, 1)
        return max(float(rates[-1]), float(slope * len(rates) + intercept))

    def replicas(self, view: FleetView) -> int:
        self.rates.append(view.window.arrival_rate_per_s or 0.0)
        while len(self.rates) > self.history:
            self.rates.popleft()
        return _bounded(math.ceil(self.predict() / self.capacity_per_replica_per_s), view)
