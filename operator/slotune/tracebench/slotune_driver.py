"""slotune in the trace benchmark: the real `slotune.loop.Tuner`, unmodified, stepped once per window on the
continuous simulation through `TraceDeployment` (its Backend and MeasurementSource) with the simulation's clock.

This is the only place the benchmark touches the loop: the problem it is given (the SLO, 60-second windows, every
engine knob slotune tunes without changing outputs, 1 to max replicas owned by capacity control, the simulator's
deployment as its prior) and how it is stepped. After a window the tuner is stepped until it has read that window
(a step that only applies a change or waits for a rollout reads nothing), at most `MAX_STEPS` times.
"""

from __future__ import annotations

from slotune.api.tuning import TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop import MemoryStateStore, Tuner, TuningProblem
from slotune.perfmodel.deployment import Deployment
from slotune.simulator.continuous import TraceDeployment, TraceSimulation
from slotune.slo import SLOSpec
from slotune.tracebench.baselines import FleetView

MAX_STEPS = 3


class SlotuneDriver:
    def __init__(self, deployment: Deployment, slo: SLOSpec, start: RuntimeConfig, window_s: float,
                 max_replicas: int) -> None:
        tuning = TuningSpec.model_validate({"windowSeconds": window_s, "capacityControl": True,
                                            "bounds": {"minReplicas": 1, "maxReplicas": max_replicas}})
        self.problem = TuningProblem(slo=slo, tuning=tuning, deployment=deployment, initial=start)
        self.deployment, self.window_s = deployment, window_s
        self.tuner: Tuner | None = None
        self.backend: TraceDeployment | None = None
        self.phases: list[str] = []
        self.per_replica: list[float] = []  # capacity control's planned requests/s per replica, after each window

    def decide(self, simulation: TraceSimulation, view: FleetView) -> RuntimeConfig:
        if self.backend is None:
            self.backend = TraceDeployment(simulation, self.deployment, self.window_s)
            self.tuner = Tuner(self.problem, self.backend, self.backend, MemoryStateStore(),
                               clock=self.backend.clock)
        assert self.tuner is not None
        self.backend.unread = view.window
        state = None
        for _ in range(MAX_STEPS):
            state = self.tuner.step()
            if self.backend.unread is None:
                break
        self.phases.append(state.phase.value if state is not None else "")
        capacity = state.capacity if state is not None else None
        self.per_replica.append(capacity.per_replica_per_s if capacity is not None else 0.0)
        return simulation.config

    def capacity_note(self) -> str:
        """What capacity control last estimated one replica of the running config serves, and from what."""
        state = self.tuner.store.load() if self.tuner is not None else None
        capacity = state.capacity if state is not None else None
        if capacity is None or capacity.estimate is None:
            return ""
        return f"{capacity.per_replica_per_s:.2f} req/s per replica, {capacity.estimate.describe()}"
