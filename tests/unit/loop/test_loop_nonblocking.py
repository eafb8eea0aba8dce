"""The loop never waits: rollouts in progress and open windows end a step, drifted replicas void a window.

The simulator is the deployment; the wrappers below add what it has no reason to produce on demand (a rollout that
takes several steps, a window that is not over yet, a replica that restarted with other knobs) and say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slotune.api.status import Phase, Verdict
from slotune.api.tuning import KnobBounds, TuningMode, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop import ApplyResult, MemoryStateStore, Tuner, TuningProblem, TuningState, WindowOpen
from slotune.perfmodel import Deployment
from slotune.simulator.backend import SimulatedDeployment
from slotune.slo import SLOSpec
from slotune.snapshot import MetricsSnapshot
from slotune.workload import Profile, WorkloadSpec

H100 = Deployment.from_names("llama-3.1-8b", "h100")
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=20)
RELAXED = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
TUNING = TuningSpec(cooldown_s=0, min_samples=50, max_iterations=8, bounds=KnobBounds(max_replicas=4))
POOR = RuntimeConfig(max_num_seqs=4, max_num_batched_tokens=512, enable_prefix_caching=False)


def _problem(tuning: TuningSpec = TUNING) -> TuningProblem:
    return TuningProblem(RELAXED, tuning, H100, POOR, CHAT)


def _world() -> SimulatedDeployment:
    return SimulatedDeployment(H100, CHAT, requests_per_window=120)


@dataclass
class _SlowRollout:
    """Each new config serves only after `calls` more apply calls, as a Deployment rollout does over several ticks."""

    inner: SimulatedDeployment
    calls: int = 3
    asked: dict[str, int] = field(default_factory=dict)
    measured_while_rolling: int = 0

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        if config == self.inner.running:
            return self.inner.apply(config)
        seen = self.asked.get(config.key(), 0) + 1
        self.asked[config.key()] = seen
        if seen < self.calls:
            return ApplyResult.rolling_out(f"{seen}/{self.calls} replicas updated")
        del self.asked[config.key()]
        return self.inner.apply(config)

    def ready(self) -> bool:
        return self.inner.ready()

    def measure(self, window_s: float) -> MetricsSnapshot:
        if self.asked:
            self.measured_while_rolling += 1
        return self.inner.measure(window_s)


def test_rollouts_in_progress_end_the_step_and_the_loop_still_converges():
    world = _world()
    slow = _SlowRollout(world)
    tuner = Tuner(_problem(), slow, slow, MemoryStateStore())
    first = tuner.step()
    assert first.phase is Phase.DEPLOYING and first.rollout == POOR and "2/3 replicas" in first.message
    assert world.running is None  # nothing serves yet, and nothing was measured
    states = [tuner.step() for _ in range(40)]
    final = states[-1]
    assert final.phase is Phase.CONVERGED
    assert slow.measured_while_rolling == 0
    waiting = [s for s in states if s.pending is not None and not s.pending.applied]
    assert waiting and all("rolling out" in s.message for s in waiting)
    assert final.changes_applied == len(final.history)  # a change counts once, however many steps its rollout took
    assert world.running == final.current


@dataclass
class _Clock:
    now_s: float = 1000.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class _TimedWindows:
    """A source whose windows end `window_s` after the previous one, read against a clock the test moves."""

    inner: SimulatedDeployment
    clock: _Clock
    ends_at_s: float = 0.0

    def measure(self, window_s: float) -> MetricsSnapshot:
        self.ends_at_s = self.ends_at_s or self.clock() + window_s
        if self.clock() < self.ends_at_s:
            raise WindowOpen(self.ends_at_s)
        self.ends_at_s = self.clock() + window_s
        return self.inner.measure(window_s)


@dataclass
class _CountingStore(MemoryStateStore):
    saves: int = 0

    def __post_init__(self) -> None:
        super().__init__()

    def save(self, state: TuningState) -> None:
        self.saves += 1
        super().save(state)


def test_an_open_window_ends_the_step_without_a_write_and_says_when_to_come_back():
    world, clock = _world(), _Clock()
    source = _TimedWindows(world, clock)
    store = _CountingStore()
    tuner = Tuner(_problem(), world, source, store, clock)
    tuner.step()
    saves = store.saves
    for _ in range(5):
        state = tuner.step()
        assert state.iteration == 0
        assert tuner.wake_at_s == source.ends_at_s == 1000.0 + TUNING.window_s
    assert store.saves == saves  # waiting costs no status write
    clock.now_s = tuner.wake_at_s
    assert tuner.step().iteration == 1


@dataclass
class _Drifts:
    """After the first judged window one replica restarts with the Deployment's own knobs (what a pod restart does
    to a config changed live); the backend notices at its post-window check and repairs it, once."""

    inner: SimulatedDeployment
    drift_after_windows: int = 1
    repair_fails: bool = False
    windows: int = 0
    drifted: bool = False

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        if config == self.inner.running and self.drifted:
            self.drifted = False
            if self.repair_fails:
                return ApplyResult.failure("pod rt-0 refused POST /admin/config: 400", crashed=False)
            return ApplyResult.success()  # re-pushed: it changed what ran during the window
        return self.inner.apply(config)

    def ready(self) -> bool:
        return self.inner.ready()

    def measure(self, window_s: float) -> MetricsSnapshot:
        self.windows += 1
        self.drifted = self.windows == self.drift_after_windows + 1
        return self.inner.measure(window_s)


def test_a_window_in_which_a_replica_drifted_is_discarded_not_judged():
    world = _world()
    drifting = _Drifts(world)
    tuner = Tuner(_problem(), drifting, drifting, MemoryStateStore())
    first = tuner.step()
    assert first.iteration == 1 and first.pending is not None  # the baseline was judged and a change applied
    second = tuner.step()
    assert second.iteration == 1 and "window discarded" in second.message
    assert second.pending == first.pending and not second.history  # no verdict from a config that did not run
    third = tuner.step()
    assert third.iteration == 2 and third.history[-1].verdict in (Verdict.KEPT, Verdict.ROLLED_BACK)


def test_a_replica_that_cannot_be_brought_in_line_is_a_reported_fault():
    world = _world()
    drifting = _Drifts(world, drift_after_windows=0, repair_fails=True)
    state = Tuner(_problem(), drifting, drifting, MemoryStateStore()).step()
    assert state.phase is Phase.DEGRADED
    assert "cannot be brought to run" in state.message and "refused POST /admin/config" in state.message


def test_mode_off_measures_and_reports_but_never_changes_anything():
    world = _world()
    tuning = TUNING.model_copy(update={"mode": TuningMode.OFF})
    tuner = Tuner(_problem(tuning), world, world, MemoryStateStore())
    for i in range(1, 5):
        state = tuner.step()
        assert state.iteration == i and state.measured.observed is not None and state.measured.slo_met is not None
        assert state.pending is None and state.changes_applied == 0 and "tuning off" in state.message
    assert world.applied == [POOR]
