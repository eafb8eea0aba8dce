"""One strategy replayed over a trace in the continuous simulation: after every window its controller picks the
replica count (and, for slotune, the knobs), and the run records what a report needs, window by window.

The trace is replayed twice back to back (a second day): requests arriving in the first pass's span belong to it.
After the last arrival the run goes on until every request finished (or `DRAIN_WINDOWS` more windows passed: what is
left then counts as missed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.simulator.continuous import TraceSimulation
from slotune.simulator.replica import SimulatedRequest
from slotune.snapshot import MetricsSnapshot
from slotune.tracebench.baselines import FleetView
from slotune.workload import PlannedRequest

DRAIN_WINDOWS = 30


@dataclass(frozen=True)
class WindowPoint:
    end_s: float
    arrival_rate_per_s: float
    num_ready: int
    num_starting: int
    gpu_seconds: float  # spent by the window's end
    snapshot: MetricsSnapshot


@dataclass
class Replayed:
    """Everything one strategy's replay left behind."""

    strategy: str
    engine_config: str  # default | oracle | tuned
    variant: str  # e.g. the queue autoscaler's threshold
    requests: tuple[PlannedRequest, ...]
    pass_s: float
    windows: list[WindowPoint] = field(default_factory=list)
    finished: list[SimulatedRequest] = field(default_factory=list)
    changes_s: list[float] = field(default_factory=list)  # when it changed what runs
    final_config: str = ""
    capacity_note: str = ""  # slotune's last capacity reading (its per-replica estimate and what it rests on)
    planned_per_replica: list[float] = field(default_factory=list)  # slotune: req/s per replica planned, per window


def two_days(requests: Sequence[PlannedRequest], pass_s: float) -> tuple[PlannedRequest, ...]:
    second = [PlannedRequest(r.arrival_s + pass_s, r.prompt_tokens, r.output_tokens, r.prefix_group,
                             r.shared_prefix_tokens, r.prefix_block_ids) for r in requests]
    return (*requests, *second)


# After a window: the simulation to act on, the view of it; returns the config to run next.
Decide = Callable[[TraceSimulation, FleetView], RuntimeConfig]


def replay(strategy: str, engine_config: str, variant: str, deployment: Deployment, start: RuntimeConfig,
           requests: tuple[PlannedRequest, ...], pass_s: float, startup_s: float, window_s: float,
           max_replicas: int, decide: Decide, record_itl: bool = False) -> Replayed:
    """Replay `requests` under `decide`; the inter-token histogram only where the controller reads it (slotune)."""
    simulation = TraceSimulation(deployment, start, requests, startup_s, record_itl=record_itl)
    run = Replayed(strategy, engine_config, variant, requests, pass_s)
    last_arrival_s = requests[-1].arrival_s
    while simulation.now_s <= last_arrival_s or (not simulation.done and
                                                 simulation.now_s < last_arrival_s + DRAIN_WINDOWS * window_s):
        snapshot = simulation.run_window(window_s)
        run.windows.append(WindowPoint(simulation.now_s, snapshot.arrival_rate_per_s or 0.0, simulation.num_ready,
                                       simulation.num_starting, simulation.gpu_seconds, snapshot))
        view = FleetView(snapshot, simulation.config.replicas, simulation.num_ready, simulation.num_starting,
                         max_replicas, window_s)
        before = simulation.config
        chosen = decide(simulation, view)  # slotune's loop applies its own changes through its backend
        if chosen != simulation.config:
            simulation.set_config(chosen)
        if simulation.config != before:
            run.changes_s.append(simulation.now_s)
    run.finished = simulation.finished
    run.final_config = simulation.config.describe()
    return run
