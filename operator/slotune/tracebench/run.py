"""One benchmark case end to end: plan the trace's two passes, find the engine configs and the sizes the baselines
need (all from the simulator, none from the arrivals to come), replay every strategy, and score each pass.

Every strategy starts from the replica count its engine config's profiled capacity gives for the first window's
arrival rate (what a user deploying for today's load would start with); the static pool starts at its size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from slotune.knobs import RuntimeConfig
from slotune.simulator.continuous import TraceSimulation
from slotune.tracebench.baselines import (
    FleetView,
    PredictivePlanner,
    QueueAutoscaler,
    SaturationAutoscaler,
    StaticPool,
)
from slotune.tracebench.case import TraceCase
from slotune.tracebench.engine import oracle_config, vllm_defaults
from slotune.tracebench.metrics import PassFigures, pass_figures
from slotune.tracebench.profile import NUM_REQUESTS, profile_capacity
from slotune.tracebench.replay import Decide, Replayed, replay, two_days
from slotune.tracebench.sizing import busiest_start_s, peak_pool
from slotune.tracebench.slotune_driver import SlotuneDriver
from slotune.traces import plan_trace
from slotune.traces.replay import PlannedTrace

QUEUE_THRESHOLDS = (0.5, 2.0, 8.0)  # num_requests_waiting per replica


@dataclass(frozen=True)
class StrategyFigures:
    strategy: str
    engine_config: str
    variant: str
    config: str
    second: PassFigures
    first: PassFigures


@dataclass(frozen=True)
class CaseResult:
    case: TraceCase
    planned: PlannedTrace
    figures: tuple[StrategyFigures, ...]
    runs: tuple[Replayed, ...]
    configs: dict[str, str]  # engine config label -> describe()
    capacity_per_replica: dict[str, float]
    static_replicas: dict[str, int]


def run_case(case: TraceCase, with_slotune: bool = True) -> CaseResult:
    planned = plan_trace(case.replay)
    requests = two_days(planned.requests, planned.duration_s)
    deployment = case.deployment
    peak_start_s = busiest_start_s(planned.requests)
    lengths = [r for r in planned.requests if r.arrival_s >= peak_start_s][:NUM_REQUESTS]
    engines = {"default": vllm_defaults(deployment)}
    engines["oracle"], _ = oracle_config(deployment, case.load.slo, lengths)
    capacity = {label: profile_capacity(deployment, c, case.load.slo, lengths).rate_per_s
                for label, c in engines.items()}
    first_rate = sum(r.arrival_s < case.window_s for r in planned.requests) / case.window_s
    runs: list[Replayed] = []
    static: dict[str, int] = {}
    for label, engine in engines.items():
        start = engine.with_changes(replicas=_replicas_for(first_rate, capacity[label], case.max_replicas))
        peak_rate = sum(peak_start_s <= r.arrival_s < peak_start_s + 300 for r in planned.requests) / 300
        static[label] = peak_pool(deployment, engine, case.load.slo, planned.requests, case.max_replicas,
                                  _replicas_for(peak_rate, capacity[label], case.max_replicas))
        controllers: list[tuple[str, str, Controller]] = [("static-peak", "", StaticPool(static[label]))]
        controllers += [("queue-autoscaler", f"waiting/replica>{t:g}", QueueAutoscaler(t)) for t in QUEUE_THRESHOLDS]
        controllers += [("saturation-autoscaler", "", SaturationAutoscaler(case.load.slo)),
                        ("predictive-planner", "", PredictivePlanner(capacity[label]))]
        for name, variant, controller in controllers:
            initial = engine.with_changes(replicas=static[label]) if name == "static-peak" else start
            runs.append(replay(name, label, variant, deployment, initial, requests, planned.duration_s,
                               case.startup_s, case.window_s, case.max_replicas, _baseline(controller)))
    if with_slotune:
        start = engines["default"].with_changes(
            replicas=_replicas_for(first_rate, capacity["default"], case.max_replicas))
        driver = SlotuneDriver(deployment, case.load.slo, start, case.window_s, case.max_replicas)
        runs.append(replay("slotune", "tuned", "", deployment, start, requests, planned.duration_s, case.startup_s,
                           case.window_s, case.max_replicas, driver.decide, record_itl=True))
    figures = tuple(StrategyFigures(r.strategy, r.engine_config, r.variant, r.final_config,
                                    pass_figures(r, case.load.slo, 1, case.window_s),
                                    pass_figures(r, case.load.slo, 0, case.window_s)) for r in runs)
    return CaseResult(case, planned, figures, tuple(runs), {k: v.describe() for k, v in engines.items()}, capacity,
                      static)


def _replicas_for(rate_per_s: float, capacity_per_s: float, max_replicas: int) -> int:
    return max(1, min(max_replicas, math.ceil(rate_per_s / max(capacity_per_s, 1e-9))))


class Controller(Protocol):
    def replicas(self, view: FleetView) -> int: ...


def _baseline(controller: Controller) -> Decide:
    def decide(simulation: TraceSimulation, view: FleetView) -> RuntimeConfig:
        return simulation.config.with_changes(replicas=controller.replicas(view))

    return decide
