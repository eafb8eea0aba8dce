"""Capacity control in the real `Tuner`, window by window, on the continuous simulation (queues carry over windows,
an ordered replica serves only after its start-up). The arrivals are Poisson with a rate that moves the way real
traffic does (a step, a fall and a ramp back, a peak beyond maxReplicas), seeded, so every run is the same run.

Each of these fails with capacity control off: the loop then judges a replica by latency before and after, which a
moving load confounds (a scale-up that lands in a backlog is rolled back; a knob is verified against a queue)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from slotune.api.status import Phase, Verdict
from slotune.api.tuning import Knob, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop import MemoryStateStore, Tuner, TuningProblem, TuningState
from slotune.loop.protocols import ApplyResult
from slotune.perfmodel.deployment import Deployment
from slotune.simulator.continuous import TraceDeployment, TraceSimulation
from slotune.slo import SLOSpec
from slotune.workload import PlannedRequest

DEPLOYMENT = Deployment.from_names("llama-3.1-8b", "nvidia-l4")
SLO = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
WINDOW_S = 60.0
CAPACITY = True
STARTUP_S = 120.0  # two windows: a replica ordered now serves from the third window on

Profile = list[tuple[float, float]]  # (seconds, requests/s)


def arrivals(profile: Profile, seed: int = 1) -> list[PlannedRequest]:
    rng = random.Random(seed)
    now, start, out = 0.0, 0.0, []
    for seconds, rate in profile:
        end = start + seconds
        while (now := now + rng.expovariate(rate)) < end:
            out.append(PlannedRequest(now, rng.randint(200, 1200), rng.randint(50, 300), None, 0))
        now = start = end
    return out


def ramp(start: float, end: float, minutes: int) -> Profile:
    return [(60.0, start + (end - start) * (i + 1) / minutes) for i in range(minutes)]


@dataclass
class Window:
    arrival_per_s: float
    met: bool
    waiting_end: float
    ready: int
    starting: int
    state: TuningState


@dataclass
class RecordingDeployment(TraceDeployment):
    """The simulation as the loop's backend, noting what ran when each config was applied (test instrumentation on
    the real component: it changes nothing)."""

    applied: list[tuple[RuntimeConfig, RuntimeConfig, int, float]] = field(default_factory=list)

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        before = self.simulation.config
        held = sum(len(m.replica.waiting) for m in self.simulation.fleet.active()) + len(self.simulation.held)
        if config != before:
            self.applied.append((before, config, self.simulation.num_starting, held))
        return super().apply(config)


def run(profile: Profile, start: RuntimeConfig, max_replicas: int = 8,
        capacity_control: bool = CAPACITY) -> tuple[list[Window], RecordingDeployment]:
    simulation = TraceSimulation(DEPLOYMENT, start, arrivals(profile), startup_s=STARTUP_S, record_itl=False)
    backend = RecordingDeployment(simulation, DEPLOYMENT, WINDOW_S)
    tuning = TuningSpec.model_validate({"windowSeconds": WINDOW_S, "capacityControl": capacity_control,
                                        "bounds": {"minReplicas": 1, "maxReplicas": max_replicas}})
    tuner = Tuner(TuningProblem(slo=SLO, tuning=tuning, deployment=DEPLOYMENT, initial=start), backend, backend,
                  MemoryStateStore(), clock=backend.clock)
    windows = []
    for _ in range(int(sum(seconds for seconds, _ in profile) // WINDOW_S)):
        snapshot = backend.advance()
        for _ in range(3):  # a step that only applies reads no window: step until this one is read
            state = tuner.step()
            if backend.unread is None:
                break
        windows.append(Window(snapshot.arrival_rate_per_s or 0.0, SLO.is_met(snapshot),
                              snapshot.num_waiting_end or 0.0, simulation.num_ready, simulation.num_starting, state))
    return windows, backend


def replica_steps(state: TuningState) -> list[str]:
    return [h.change for h in state.history if h.knob is Knob.REPLICAS]


def test_a_scale_up_ordered_into_a_growing_backlog_is_kept_and_the_backlog_drains() -> None:
    windows, _ = run([(600.0, 1.0), (1500.0, 4.0)], RuntimeConfig(replicas=1, max_num_seqs=64))
    final = windows[-1].state
    ups = [h for h in final.history if h.verdict is Verdict.SCALED and h.knob is Knob.REPLICAS]
    assert ups and ups[0].change.startswith("replicas 1 -> "), replica_steps(final)
    added = windows[11].ready + windows[11].starting
    assert added >= 4, "the step to 4 requests/s is met with replicas ordered in the window it arrived"
    assert max(w.waiting_end for w in windows[10:14]) > 20, "the scale-up was ordered into a growing backlog"
    # Judged by what it served or drained (a step a later one superseded before it served is judged with it).
    assert any("did what the capacity model predicted" in (h.detail or "") for h in ups[:2]), replica_steps(final)
    assert not any(h.verdict is Verdict.ROLLED_BACK and h.knob is Knob.REPLICAS for h in final.history)
    drained = next(i for i in range(12, len(windows)) if windows[i].waiting_end < windows[i].ready)
    assert min(w.ready for w in windows[12:drained + 1]) >= 4, "the scale-up stood until the backlog drained"
    tail = windows[-8:]
    assert all(w.met and w.waiting_end < w.ready for w in tail), [(w.met, w.waiting_end) for w in tail]


def test_a_load_that_falls_then_rises_gets_replicas_back_before_missing_more_than_one_window() -> None:
    profile = [(900.0, 4.0), *ramp(4.0, 1.0, 10), (600.0, 1.0), *ramp(1.0, 4.0, 10), (600.0, 4.0)]
    windows, backend = run(profile, RuntimeConfig(replicas=4, max_num_seqs=64))
    lull = windows[25:35]
    assert min(w.ready for w in lull) <= 2, "the lull sheds replicas"
    rise = windows[35:]
    missed = [i for i, w in enumerate(rise) if not w.met]
    assert len(missed) <= 1, f"windows of the rise that missed: {missed}"
    assert max(w.ready for w in rise[-5:]) >= 3, "the replicas came back for the rise"
    static = 4 * len(windows) * WINDOW_S
    assert backend.simulation.gpu_seconds < 0.85 * static


def test_infeasible_at_a_peak_clears_when_the_rate_falls() -> None:
    windows, _ = run([(600.0, 1.5), (900.0, 5.0), (1200.0, 1.5)], RuntimeConfig(replicas=1, max_num_seqs=64),
                     max_replicas=2)
    peak = windows[11:25]
    assert all(w.state.capacity is not None and w.state.capacity.infeasible_at_rate for w in peak)
    assert all(w.ready + w.starting == 2 for w in peak), "the most it may use, throughout the peak"
    status = peak[-1].state.to_status().capacity
    assert status is not None and status.infeasible_at_rate
    after = windows[-5:]
    assert all(w.met for w in after)
    assert all(w.state.capacity is not None and not w.state.capacity.infeasible_at_rate for w in after)
    assert after[-1].state.phase is not Phase.INFEASIBLE
    assert not any(w.state.phase is Phase.INFEASIBLE for w in windows), \
        "a window that measured the queue is no verdict on the config"


def test_a_knob_change_waits_during_a_backlog_or_a_start_up() -> None:
    # max_num_seqs 8 binds at this load: the search has a change to make, and the step brings a backlog first.
    windows, backend = run([(600.0, 1.0), (1500.0, 4.0)], RuntimeConfig(replicas=1, max_num_seqs=8))
    knob_changes = [(before, after, starting, held) for before, after, starting, held in backend.applied
                    if before.with_changes(replicas=1) != after.with_changes(replicas=1)]
    assert knob_changes, "the search changed an engine knob at some point"
    for before, after, starting, held in knob_changes:
        assert starting == 0, f"{before.describe()} -> {after.describe()} while {starting} replica(s) started"
        assert held < after.replicas, f"{before.describe()} -> {after.describe()} with {held} queued"
    waited = [w for w in windows if "configuration search waits" in w.state.message]
    assert waited, "the windows of the backlog and the start-up were not handed to the search"


def test_a_noisy_stationary_load_does_not_flap() -> None:
    # An hour around 3 requests/s with slow swings and Poisson noise: a few steps, never up and down in turn.
    profile = [(60.0, 3.0 + 0.6 * ((i // 10) % 2 * 2 - 1)) for i in range(60)]
    windows, _ = run(profile, RuntimeConfig(replicas=3, max_num_seqs=64))
    steps = replica_steps(windows[-1].state)
    assert len(steps) <= 6, steps
    assert sum(not w.met for w in windows[5:]) <= 2
