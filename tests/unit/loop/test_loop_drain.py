"""A replica increase made after an overload is judged once the queue it inherited has drained (slotune.loop.drain):
the first window after 1 -> 2 replicas still serves the old replica's backlog, each request with the wait it already
had, and judged as it stands it rolled a good change back (tests/e2e/test_workload_shift.py saw it)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from slotune.api.status import Phase, Verdict
from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop import ApplyResult, MemoryStateStore, Tuner, TuningProblem, TuningState
from slotune.loop.drain import MAX_DRAIN_WINDOWS
from slotune.loop.state import PendingChange
from slotune.perfmodel import Deployment
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, LatencySummary, MetricsSnapshot, Source

SLO = SLOSpec.model_validate({"ttft": {"p99": 1000}})
ONE = RuntimeConfig(max_num_seqs=8, replicas=1)
TWO = ONE.with_changes(replicas=2)


def _window(ttft_ms: float, waiting_per_replica: float, seed: int, n: int = 300) -> MetricsSnapshot:
    samples = np.random.default_rng(seed).lognormal(np.log(ttft_ms), 0.3, n)
    return MetricsSnapshot(Source.SIMULATOR, 10.0, n, ttft=LatencySummary.from_samples(samples),
                           num_waiting_mean=waiting_per_replica)


# The overloaded baseline: one replica, 12 requests waiting on average, TTFT ~3 s.
OVERLOADED = _window(3000.0, 12.0, 0)


@dataclass
class Replicas:
    """The backend and the source: the configs applied, and the windows after the change in order."""

    after: list[MetricsSnapshot]
    applied: list[RuntimeConfig] = field(default_factory=list)

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        changed = not self.applied or self.applied[-1] != config
        self.applied.append(config)
        return ApplyResult.success(changed=changed)

    def ready(self) -> bool:
        return True

    def measure(self, window_s: float) -> MetricsSnapshot:
        return self.after.pop(0)


def _tuner(after: list[MetricsSnapshot]) -> tuple[Tuner, Replicas]:
    replicas = Replicas(after)
    problem = TuningProblem(SLO, TuningSpec(cooldown_s=0, min_samples=10, bounds=KnobBounds(max_replicas=3)),
                            Deployment.from_names("llama-3.1-8b", "h100"), ONE)
    store = MemoryStateStore()
    pending = PendingChange(config=TWO, previous=ONE, knob=Knob.REPLICAS, change="replicas 1 -> 2",
                            reason="queueing", target_metric=LatencyMetric.TTFT, target_percentile=99)
    store.save(TuningState(phase=Phase.TUNING, current=ONE, pending=pending, baseline=OVERLOADED,
                           tried_keys=frozenset({ONE.key()})))
    replicas.apply(ONE)
    return Tuner(problem, replicas, replicas, store), replicas


def test_the_window_still_draining_the_old_backlog_is_not_judged() -> None:
    # After 1 -> 2: the first window serves the backlog (TTFT ~4.5 s, worse than the baseline; 4 waiting per replica,
    # 8 in all, down from 12), the next is the new capacity's own (TTFT ~200 ms, nothing waiting).
    tuner, replicas = _tuner([_window(4500.0, 4.0, 1), _window(200.0, 0.0, 2)])
    state = tuner.step()  # the change goes out
    assert state.pending is not None and state.pending.applied and replicas.applied[-1] == TWO
    state = tuner.step()  # the draining window: not judged
    assert state.pending is not None and not state.history and state.pending.drain_windows == 1
    assert "still draining" in state.message and state.pending.drain_backlog == 8.0
    state = tuner.step()  # the drained window: kept
    assert state.history[0].verdict is Verdict.KEPT and state.current.replicas >= 2


def test_a_backlog_that_does_not_fall_is_judged_at_once() -> None:
    # Two replicas still queue as much as one did (12 in all): that is the new config's steady state, not a drain.
    tuner, _ = _tuner([_window(4500.0, 6.0, 1), _window(200.0, 0.0, 2)])
    tuner.step()
    state = tuner.step()
    assert state.history and state.history[0].verdict is Verdict.ROLLED_BACK


def test_the_wait_for_a_drain_is_bounded() -> None:
    draining = [_window(4500.0, 5.0 - i, 1 + i) for i in range(MAX_DRAIN_WINDOWS + 1)]  # falling every window
    tuner, _ = _tuner([*draining, _window(200.0, 0.0, 9)])
    tuner.step()
    for skipped in range(1, MAX_DRAIN_WINDOWS + 1):
        state = tuner.step()
        assert state.pending is not None and state.pending.drain_windows == skipped and not state.history
    state = tuner.step()  # judged as it stands
    assert state.history and state.history[0].verdict is Verdict.ROLLED_BACK


def test_a_change_that_adds_no_replicas_is_judged_on_its_first_window() -> None:
    tuner, _ = _tuner([_window(4500.0, 4.0, 1)])
    state = tuner.store.load()
    assert state is not None and state.pending is not None
    seqs = replace(state.pending.proposal, config=ONE.with_changes(max_num_seqs=16), knob=Knob.MAX_NUM_SEQS,
                   change="maxNumSeqs 8 -> 16")
    tuner.store.save(state.evolve(pending=state.pending.model_copy(update={"proposal": seqs})))
    tuner.step()
    state = tuner.step()
    assert state.history and state.history[0].verdict is Verdict.ROLLED_BACK
