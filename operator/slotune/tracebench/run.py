"""One benchmark case end to end: plan the trace's two passes, find the engine configs and the sizes the baselines
need (all from the simulator, none from the arrivals to come), replay every strategy, and score each pass.

Every strategy starts from the replica count its engine config's profiled capacity gives for the first window's
arrival rate (what a user deploying for today's load would start with); the static pool starts at its size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
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
from slotune.tracebench.goal import required_attainment
from slotune.tracebench.hindsight import HindsightPool, hindsight_pool
from slotune.tracebench.metrics import StrategyFigures, pass_figures
from slotune.tracebench.profile import profile_capacity
from slotune.tracebench.replay import Decide, Replayed, replay, two_days
from slotune.tracebench.sizing import PEAK_S, busiest_start_s, peak_pool
from slotune.tracebench.slotune_driver import SlotuneDriver
from slotune.traces import plan_trace
from slotune.traces.replay import PlannedTrace
from slotune.workload import PlannedRequest

QUEUE_THRESHOLDS = (0.5, 2.0, 8.0)  # num_requests_waiting per replica


def best_variants(figures: tuple[StrategyFigures, ...]) -> set[tuple[str, str, str]]:
    """(strategy, engine_config, variant) of each strategy's best variant per engine config."""
    best: dict[tuple[str, str], StrategyFigures] = {}
    for f in figures:
        key = (f.strategy, f.engine_config)
        held = best.get(key)
        if held is None or (f.second.attainment, -f.second.gpu_hours) > (held.second.attainment,
                                                                            -held.second.gpu_hours):
            best[key] = f
    return {(f.strategy, f.engine_config, f.variant) for f in best.values()}


@dataclass(frozen=True)
class CaseResult:
    case: TraceCase
    planned: PlannedTrace
    figures: tuple[StrategyFigures, ...]
    runs: tuple[Replayed, ...]
    configs: dict[str, str]  # engine config label -> describe()
    capacity_per_replica: dict[str, float]
    static_replicas: dict[str, int]
    hindsight: dict[str, HindsightPool] = field(default_factory=dict)  # engine config label -> the yardstick


@dataclass(frozen=True)
class _Setup:
    """What every strategy of a case shares: the plan, both passes, the engine configs and their capacities."""

    planned: PlannedTrace
    requests: tuple[PlannedRequest, ...]  # both passes
    deployment: Deployment
    engines: dict[str, RuntimeConfig]
    capacity: dict[str, float]
    first_rate_per_s: float  # arrivals in the first window: what a user deploying today would size for
    peak_rate_per_s: float  # over the busiest five minutes: the static pool's search starts there


def run_case(case: TraceCase, with_slotune: bool = True) -> CaseResult:
    setup = _prepare(case)
    runs: list[Replayed] = []
    static: dict[str, int] = {}
    for label in setup.engines:
        static[label], replayed = _baselines(case, setup, label)
        runs += replayed
    if with_slotune:
        runs.append(_slotune(case, setup))
    figures = tuple(StrategyFigures(r.strategy, r.engine_config, r.variant, r.final_config,
                                    pass_figures(r, case.load.slo, 1, case.window_s),
                                    pass_figures(r, case.load.slo, 0, case.window_s)) for r in runs)
    bar = required_attainment(figures)
    hindsight = {label: hindsight_pool(setup.deployment, engine, label, case.load.slo, setup.planned.requests,
                                       setup.planned.duration_s, case.window_s, case.max_replicas, bar,
                                       setup.peak_rate_per_s / static[label])
                 for label, engine in setup.engines.items()}
    return CaseResult(case, setup.planned, figures, tuple(runs),
                      {k: v.describe() for k, v in setup.engines.items()}, setup.capacity, static, hindsight)


def _prepare(case: TraceCase) -> _Setup:
    planned = plan_trace(case.replay)
    deployment = case.deployment
    peak_start_s = busiest_start_s(planned.requests)
    peak = [r for r in planned.requests if peak_start_s <= r.arrival_s < peak_start_s + PEAK_S]
    lengths = [r for r in planned.requests if r.arrival_s >= peak_start_s]
    engines = {"default": vllm_defaults(deployment)}
    engines["oracle"], _ = oracle_config(deployment, case.load.slo, lengths)
    capacity = {label: profile_capacity(deployment, c, case.load.slo, lengths).rate_per_s
                for label, c in engines.items()}
    first_rate = sum(r.arrival_s < case.window_s for r in planned.requests) / case.window_s
    return _Setup(planned, two_days(planned.requests, planned.duration_s), deployment, engines, capacity,
                  first_rate, len(peak) / PEAK_S)


def _baselines(case: TraceCase, setup: _Setup, label: str) -> tuple[int, list[Replayed]]:
    """Every baseline with one engine config; the static pool's size too."""
    engine, capacity = setup.engines[label], setup.capacity[label]
    start = engine.with_changes(replicas=_replicas_for(setup.first_rate_per_s, capacity, case.max_replicas))
    static = peak_pool(setup.deployment, engine, case.load.slo, setup.planned.requests, case.max_replicas,
                       _replicas_for(setup.peak_rate_per_s, capacity, case.max_replicas))
    controllers: list[tuple[str, str, Controller]] = [("static-peak", "", StaticPool(static))]
    controllers += [("queue-autoscaler", f"waiting/replica>{t:g}", QueueAutoscaler(t)) for t in QUEUE_THRESHOLDS]
    controllers += [("saturation-autoscaler", "", SaturationAutoscaler(case.load.slo)),
                    ("predictive-planner", "", PredictivePlanner(capacity))]
    runs = []
    for name, variant, controller in controllers:
        initial = engine.with_changes(replicas=static) if name == "static-peak" else start
        runs.append(replay(name, label, variant, setup.deployment, initial, setup.requests,
                           setup.planned.duration_s, case.startup_s, case.window_s, case.max_replicas,
                           _baseline(controller)))
    return static, runs


def _slotune(case: TraceCase, setup: _Setup) -> Replayed:
    """slotune from vLLM's defaults at the replicas the defaults' capacity gives for the first window."""
    replicas = _replicas_for(setup.first_rate_per_s, setup.capacity["default"], case.max_replicas)
    start = setup.engines["default"].with_changes(replicas=replicas)
    driver = SlotuneDriver(setup.deployment, case.load.slo, start, case.window_s, case.max_replicas)
    replayed = replay("slotune", "tuned", "", setup.deployment, start, setup.requests, setup.planned.duration_s,
                      case.startup_s, case.window_s, case.max_replicas, driver.decide, record_itl=True)
    replayed.capacity_note = driver.capacity_note()
    replayed.planned_per_replica = driver.per_replica
    return replayed


def _replicas_for(rate_per_s: float, capacity_per_s: float, max_replicas: int) -> int:
    return max(1, min(max_replicas, math.ceil(rate_per_s / max(capacity_per_s, 1e-9))))


class Controller(Protocol):
    def replicas(self, view: FleetView) -> int: ...


def _baseline(controller: Controller) -> Decide:
    def decide(simulation: TraceSimulation, view: FleetView) -> RuntimeConfig:
        return simulation.config.with_changes(replicas=controller.replicas(view))

    return decide
