"""A config that met the SLO misses one window while the loop confirms it: it is measured again before any change,
as a converged one is. The workload-shift e2e on a busy machine: replicas 1 -> 3 kept ("SLO now met"), one met
window, then one window over the TTFT target; at maxReplicas with nothing left to try the run ended Infeasible on
that single window. Once per config: one whose windows keep alternating is judged at its second miss."""

from __future__ import annotations

from slotune.api.status import Phase
from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.loop import MemoryStateStore, Tuner, TuningProblem, TuningState
from slotune.perfmodel import Deployment
from tests.unit.loop.test_loop_drain import ONE, SLO, Replicas, _window

THREE = ONE.with_changes(replicas=3)
MET, MISSED = _window(300.0, 0.0, 1), _window(1500.0, 0.5, 2)  # TTFT P99 against 1,000 ms


def _confirming(windows: list) -> Tuner:
    """At maxReplicas (3), replicas the only knob: nothing left to try; one met window of the config so far."""
    backend = Replicas(windows)
    tuning = TuningSpec(cooldown_s=0, min_samples=10, knobs=[Knob.REPLICAS], bounds=KnobBounds(max_replicas=3))
    problem = TuningProblem(SLO, tuning, Deployment.from_names("llama-3.1-8b", "h100"), THREE)
    store = MemoryStateStore()
    store.save(TuningState(phase=Phase.MEASURING, current=THREE, tried_keys=frozenset({ONE.key(), THREE.key()}),
                           windows_met=1, streak=(_window(300.0, 0.0, 0),), streak_of=THREE.describe(),
                           slo_met=True))
    backend.apply(THREE)
    return Tuner(problem, backend, backend, store)


def _measured_to_rest(tuner: Tuner, state: TuningState) -> TuningState:
    """Steps while the loop measures; it must end converged at 3 replicas, the loop trying a cheaper config (a
    trim) as it does on rest."""
    while state.phase is Phase.MEASURING:
        state = tuner.step()
    converged = state.phase is Phase.CONVERGED or (state.pending is not None and state.pending.proposal.trim)
    assert converged, state.message
    return state


def test_one_missed_window_after_met_ones_is_measured_again_not_infeasible() -> None:
    tuner = _confirming([MISSED, MET, MET, MET, MET, MET])
    state = tuner.step()
    assert state.phase is Phase.MEASURING and state.infeasible is None, state.message
    assert "measuring it again" in state.message
    state = _measured_to_rest(tuner, state)
    assert state.infeasible is None, state.message


def test_a_second_miss_of_the_same_config_is_judged() -> None:
    tuner = _confirming([MISSED, MET, MISSED])
    states = [tuner.step() for _ in range(3)]
    assert [s.phase for s in states[:2]] == [Phase.MEASURING, Phase.MEASURING]
    assert states[2].phase is Phase.INFEASIBLE, states[2].message


def test_infeasible_called_on_a_busy_moment_ends_once_the_config_meets_the_slo_again() -> None:
    # The workload-shift e2e again, a busier moment: the second miss at 2 replicas was judged (Infeasible, 3 had not
    # helped), then the other work ended and every window met the SLO at the same load, while the status kept
    # saying Infeasible. One met window is not evidence; two in a row (convergenceWindows) re-open the loop.
    tuner = _confirming([MISSED, MET, MISSED, MET, MET, *([MET] * 8)])
    assert [tuner.step().phase for _ in range(3)][-1] is Phase.INFEASIBLE
    assert tuner.step().phase is Phase.INFEASIBLE
    state = tuner.step()
    assert state.phase is Phase.MEASURING and state.infeasible is None, state.message
    assert "every SLO target holds again in 2 windows in a row" in state.message
    _measured_to_rest(tuner, state)


def test_a_met_window_between_misses_keeps_infeasible() -> None:
    tuner = _confirming([MISSED, MET, MISSED, MET, MISSED, MET, MISSED])
    phases = [tuner.step().phase for _ in range(7)]
    assert phases[2:] == [Phase.INFEASIBLE] * 5, phases


def test_an_infeasible_that_keeps_reopening_at_one_load_asks_twice_the_met_windows_each_time() -> None:
    # A config at the SLO's edge (the workload-shift e2e on a box slower than at its calibration): two misses, two
    # met windows, again and again at one load. Re-opened after every two met windows it flapped Infeasible ->
    # Measuring for 15 minutes; each re-open asks twice the met windows of the one before, so a run of met windows
    # long enough still ends Infeasible, and the flapping does not.
    edge = [MISSED, MISSED, MET, MET] * 10
    tuner = _confirming([MISSED, MET, MISSED, *edge, *[MET] * 8])
    states = [tuner.step() for _ in range(3 + len(edge))]
    assert states[2].phase is Phase.INFEASIBLE, states[2].message
    reopened = [s.message for s in states if s.message.startswith("re-opened")]
    assert reopened[0].startswith("re-opened: every SLO target holds again in 2 windows in a row"), reopened
    assert len(reopened) == 1, reopened  # the second asks 4 met windows in a row: the edge never has them
    assert states[-1].phase is Phase.INFEASIBLE, states[-1].message
    after = [tuner.step().message for _ in range(4)]
    assert any(m.startswith("re-opened: every SLO target holds again in 4 windows in a row at this load (re-opened "
                            "1 time(s) before") for m in after), after
