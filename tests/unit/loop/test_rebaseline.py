"""A fresh baseline when the machine's speed drifted between the baseline and the candidate (slotune.loop.rebaseline).

Issue 17's real run judged a candidate measured at load average 8 against a baseline measured at 1-4 on a 2-core CPU
runtime. Here the candidate (token budget 2048 -> 512, for TPOT) is better at equal speed (TPOT p99 x0.7), but its
window ran on a machine twice as slow as the baseline's: judged as is, it is rolled back. Its steps read x2.0 the
baseline's speed on the profile, so the kept config is measured again and the candidate judged against that.
"""

from __future__ import annotations

from slotune.api.status import Phase, Verdict
from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop import MemoryStateStore, Tuner, TuningProblem, TuningState
from slotune.loop.state import PendingChange
from slotune.perfmodel import Deployment
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, MetricsSnapshot
from slotune.workload import Profile, WorkloadSpec
from tests.unit.loop.test_loop_drain import Replicas  # the scripted backend and source

H100 = Deployment.from_names("llama-3.1-8b", "h100")
SLOW = H100.slower(2.0)  # the same machine, every step twice as long (a noisy neighbour)
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=4)
SLO = SLOSpec.model_validate({"tpot": {"p99": 9}})
WIDE = RuntimeConfig(max_num_seqs=32, max_num_batched_tokens=2048, replicas=1)
NARROW = WIDE.with_changes(max_num_batched_tokens=512)
TWO = WIDE.with_changes(replicas=2)
ROOMY = SLOSpec.model_validate({"tpot": {"p99": 15}})  # one replica meets it at full speed (~10 ms), not at half


def _window(deployment: Deployment, config: RuntimeConfig, seed: int) -> MetricsSnapshot:
    return simulate_workload(deployment, config, CHAT, 300, seed=seed).snapshot


def _tuner(baseline: MetricsSnapshot, after: list[MetricsSnapshot], previous: RuntimeConfig,
           candidate: RuntimeConfig, trim: bool = False, slo: SLOSpec | None = None) -> tuple[Tuner, Replicas]:
    backend = Replicas(after)
    most = max(previous.replicas, candidate.replicas)
    problem = TuningProblem(slo or (ROOMY if trim else SLO), TuningSpec(cooldown_s=0, min_samples=10, bounds=KnobBounds(
        max_replicas=most)), H100, previous)
    store = MemoryStateStore()
    knob, change = ((Knob.REPLICAS, "replicas") if candidate.replicas != previous.replicas
                    else (Knob.MAX_NUM_BATCHED_TOKENS, "token budget"))
    pending = PendingChange(config=candidate, previous=previous, knob=knob, change=change,
                            reason="prefill steps stall decodes", target_metric=LatencyMetric.TPOT,
                            target_percentile=99, trim=trim)
    phase = Phase.CONVERGED if trim else Phase.TUNING
    store.save(TuningState(phase=phase, current=previous, pending=pending, baseline=baseline,
                           tried_keys=frozenset({previous.key()})))
    backend.apply(previous)
    return Tuner(problem, backend, backend, store), backend


def _switches(backend: Replicas) -> list[RuntimeConfig]:
    """The configs applied, a repeat of the one running (the loop's check that it still runs) left out."""
    return [c for i, c in enumerate(backend.applied) if i == 0 or backend.applied[i - 1] != c]


def _until_judged(tuner: Tuner) -> TuningState:
    for _ in range(8):
        state = tuner.step()
        if state.history:
            return state
    raise AssertionError(f"never judged: {state.message}")


def test_a_candidate_measured_on_a_slower_machine_is_judged_against_a_fresh_baseline():
    baseline = _window(H100, WIDE, 0)  # TPOT p99 ~10.7 ms at full speed
    slow_candidate, slow_baseline = _window(SLOW, NARROW, 1), _window(SLOW, WIDE, 2)
    assert slow_candidate.tpot.p99_ms > baseline.tpot.p99_ms  # as is, the change looks like a regression
    after = [slow_candidate, slow_baseline, _window(SLOW, NARROW, 3), _window(SLOW, NARROW, 4)]
    tuner, backend = _tuner(baseline, after, WIDE, NARROW)
    state = _until_judged(tuner)
    assert state.history[0].verdict is Verdict.KEPT, state.history[0]
    assert _switches(backend)[:4] == [WIDE, NARROW, WIDE, NARROW]  # the kept config measured again, then the change
    next_change = state.pending is not None and state.pending.applied  # decided in the same step as the verdict
    assert state.changes_applied == 1 + next_change  # the change re-applied is the same change, not a new one


def test_the_drift_message_says_why_the_baseline_is_measured_again():
    tuner, backend = _tuner(_window(H100, WIDE, 0), [_window(SLOW, NARROW, 1), _window(SLOW, WIDE, 2)], WIDE, NARROW)
    tuner.step()  # the change goes out
    state = tuner.step()  # judged as is: a rollback resting on the drift
    assert not state.history and state.pending is not None and state.pending.rebaseline, state.message
    assert "drifted" in state.message and backend.applied[-1] == WIDE


def test_a_regression_at_equal_speed_is_rolled_back_at_once():
    tuner, backend = _tuner(_window(H100, NARROW, 0), [_window(H100, WIDE, 1)], NARROW, WIDE)
    state = _until_judged(tuner)
    assert state.history[0].verdict is Verdict.ROLLED_BACK, state.history[0]
    assert _switches(backend) == [NARROW, WIDE, NARROW]  # no fresh baseline: the speed did not move


def test_a_trim_that_missed_on_a_slower_machine_is_tried_again_after_a_fresh_baseline():
    """A trim is kept only if the SLO holds on the fewer replicas, so a window on a machine twice as slow breaks it
    for the trim: one replica misses TPOT P99 15 ms at half speed (~25-32 ms) and meets it at full (~10 ms)."""
    baseline = _window(H100, TWO, 0)
    after = [_window(SLOW, WIDE, 1), _window(H100, TWO, 2), *(_window(H100, WIDE, seed) for seed in (3, 4, 5))]
    tuner, backend = _tuner(baseline, after, TWO, WIDE, trim=True)
    state = _until_judged(tuner)
    assert state.history[0].verdict is Verdict.KEPT and state.history[0].trim, state.history[0]
    assert _switches(backend)[:4] == [TWO, WIDE, TWO, WIDE]  # the replicas back for a fresh baseline, then the trim
    assert state.current == WIDE


def test_a_trim_that_missed_at_equal_speed_is_rolled_back_at_once():
    # Both windows on the slow machine: the miss is the trim's.
    tuner, backend = _tuner(_window(SLOW, TWO, 0), [_window(SLOW, WIDE, 1)], TWO, WIDE, trim=True)
    state = _until_judged(tuner)
    assert state.history[0].verdict is Verdict.ROLLED_BACK and state.history[0].trim, state.history[0]
    assert _switches(backend) == [TWO, WIDE, TWO]


def test_a_fix_whose_fresh_baseline_meets_the_slo_is_not_made():
    """A replica added for a window that missed (TPOT P99 10.7 ms against 10), judged on a window twice as slow: the
    kept config is measured again, meets the SLO (9.7 ms), and the replica is not added after all. It was never
    judged, so a later miss may ask for it again."""
    slo = SLOSpec.model_validate({"tpot": {"p99": 10}})
    missed, fresh = _window(H100, WIDE, 0), _window(H100, WIDE, 1)
    assert not slo.is_met(missed) and slo.is_met(fresh)
    after = [_window(SLOW, TWO, 1), fresh, *(_window(H100, WIDE, seed) for seed in (2, 3, 4))]
    tuner, backend = _tuner(missed, after, WIDE, TWO, slo=slo)
    state = _until_judged(tuner)
    assert state.history[0].verdict is Verdict.ROLLED_BACK and "not needed" in state.history[0].detail
    assert _switches(backend)[:3] == [WIDE, TWO, WIDE] and state.current == WIDE
    assert TWO.key() not in state.learned.tried_keys and state.changes_applied == 0
