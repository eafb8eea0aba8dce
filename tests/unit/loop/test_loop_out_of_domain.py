"""Measurements outside their domain never crash the loop: a window carrying one (more accepted than drafted tokens,
a NaN, a negative rate, a histogram whose counts went backwards) is discarded, or the value ignored, and the status
says which. The simulator is the deployment; the wrapper below corrupts one field of its windows, a fault the
simulator (and a healthy engine) cannot be made to produce on demand."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slotune.api.status import Phase
from slotune.api.tuning import KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop import MemoryStateStore, Tuner, TuningProblem, TuningState
from slotune.metrics.domain import checked
from slotune.perfmodel import Deployment
from slotune.simulator.backend import SimulatedDeployment
from slotune.slo import SLOSpec
from slotune.snapshot import Histogram, LatencySummary, MetricsSnapshot
from slotune.workload import Profile, WorkloadSpec

H100 = Deployment.from_names("llama-3.1-8b", "h100")
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=20)
SLO = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
TUNING = TuningSpec(cooldown_s=0, min_samples=50, max_iterations=8, bounds=KnobBounds(max_replicas=4))
POOR = RuntimeConfig(max_num_seqs=4, max_num_batched_tokens=512, enable_prefix_caching=False)
FIELDS = tuple(f.name for f in fields(MetricsSnapshot) if f.name != "source")
BAD_NUMBERS = (math.nan, math.inf, -math.inf, -1.0, -0.5, 3.34)


def _bad_latency(summary: LatencySummary, how: int) -> LatencySummary:
    if how == 0:
        return replace(summary, p99_ms=math.nan)
    if how == 1:
        return replace(summary, p50_ms=-12.0)
    if how == 2:
        return replace(summary, count=-3)
    if how == 3:
        return replace(summary, mean_ms=math.inf)
    upper = (0.1, 1.0, math.inf)
    return replace(summary, histogram=Histogram(upper, (5.0, -2.0, 1.0)))  # a counter that went backwards


def _corrupt(snapshot: MetricsSnapshot, name: str, pick: int) -> MetricsSnapshot:
    value = getattr(snapshot, name)
    if isinstance(value, LatencySummary):
        return replace(snapshot, **{name: _bad_latency(value, pick % 5)})
    if isinstance(value, int) and not isinstance(value, bool):
        return replace(snapshot, **{name: -1 - pick})
    return replace(snapshot, **{name: BAD_NUMBERS[pick % len(BAD_NUMBERS)]})


def _out_of_domain(snapshot: MetricsSnapshot, name: str) -> bool:
    """Whether the corruption put the field outside its domain (3.34 is a fine request rate, not a fine ratio)."""
    check = checked(snapshot)
    return bool(check.discarded) or any(line.startswith(name) for line in check.ignored)


@dataclass
class _Corrupting:
    """The simulator, with one field of chosen windows set outside its domain."""

    inner: SimulatedDeployment
    name: str
    pick: int
    windows: frozenset[int]
    seen: int = 0
    last: MetricsSnapshot | None = None  # the last window corrupted, as the loop read it

    def measure(self, window_s: float) -> MetricsSnapshot:
        snapshot = self.inner.measure(window_s)
        self.seen += 1
        if self.seen in self.windows:
            self.last = _corrupt(snapshot, self.name, self.pick)
            return self.last
        return snapshot


def _tuner(source: object, world: SimulatedDeployment) -> Tuner:
    return Tuner(TuningProblem(SLO, TUNING, H100, POOR, CHAT), world, source, MemoryStateStore())  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FIELDS), pick=st.integers(0, 20), windows=st.frozensets(st.integers(1, 4), min_size=1))
def test_no_out_of_domain_value_crashes_the_loop_and_each_is_reported(name: str, pick: int,
                                                                        windows: frozenset[int]) -> None:
    world = SimulatedDeployment(H100, CHAT, requests_per_window=80, spec_acceptance_rate=0.7)
    source = _Corrupting(world, name, pick, windows)
    tuner = _tuner(source, world)
    for _ in range(4):
        source.last = None
        state = tuner.step()
        assert state.to_status().phase is state.phase  # the API models accept everything the state holds
        assert TuningState.from_json(state.to_json()) == state
        assert state.phase is not Phase.DEGRADED
        if source.last is not None and _out_of_domain(source.last, name):
            assert name in state.message, state.message


def test_more_accepted_than_drafted_tokens_is_ignored_and_said():
    """Acceptance 3.34 came from a simulator's counters and killed the Tuner in `Observed` (pydantic)."""
    world = SimulatedDeployment(H100, CHAT, requests_per_window=80)
    source = _Corrupting(world, "spec_acceptance_rate", BAD_NUMBERS.index(3.34), frozenset({1}))
    state = _tuner(source, world).step()
    assert state.measured.observed is not None and state.measured.observed.spec_acceptance_rate is None
    assert "spec_acceptance_rate 3.34" in state.message
    assert state.iteration == 1  # the window was judged on the rest


def test_a_histogram_going_backwards_discards_the_window():
    world = SimulatedDeployment(H100, CHAT, requests_per_window=80)
    source = _Corrupting(world, "ttft", 4, frozenset({1}))
    state = _tuner(source, world).step()
    assert state.iteration == 0 and not state.measured.metrics_available and state.pending is None
    assert "window discarded" in state.message and "ttft histogram counts went backwards" in state.message


def test_checked_keeps_a_window_inside_its_domain_as_it_is():
    world = SimulatedDeployment(H100, CHAT, requests_per_window=60)
    world.apply(POOR)
    snapshot = world.measure(30)
    check = checked(snapshot)
    assert check.snapshot is snapshot and not check.ignored and not check.discarded
