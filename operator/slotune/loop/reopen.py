"""The loop's reopen step: at rest (Converged, Infeasible) every window's measured load is checked against the
windows the loop came to rest on (loop.shift: a stated test per statistic); a shift is recorded in the history and
tuning resumes from the current config with a fresh budget: more capacity or other knobs when the SLO now misses,
fewer replicas (the policy's trims) when the load fell and it still holds. Infeasible and Degraded also re-open
when the spec's SLO or tuning changes, and Degraded when the backend had scaled the replicas to what fits and its
retry is due: the config is rolled out again as at the start, staying Degraded until it serves, and the status
says how the retry ended.
"""

from __future__ import annotations

from slotune.api.status import Observed, Phase, Verdict
from slotune.loop.capacity import CapacityControlStep
from slotune.loop.protocols import retry_fit
from slotune.loop.shift import LoadShift, WindowLoad, watch
from slotune.loop.state import HistoryRecord, TuningState, now_utc
from slotune.snapshot import MetricsSnapshot

MAX_REOPEN_BACKOFF = 8  # the most times convergenceWindows a re-open at one load asks


class ReopenStep(CapacityControlStep):
    def _reopen_if_changed(self, state: TuningState) -> TuningState:
        """Infeasible and Degraded hold until the spec changes, or (Infeasible) a window shows another workload:
        request rate, prompt or output lengths, or prefix-cache hit rate moved (loop.shift). Infeasible also ends
        when the config it rests on meets every target again in `convergenceWindows` windows in a row at the same
        load: what missed was the moment's (a machine slowed by other work, in the workload-shift e2e, called
        2 replicas Infeasible and kept saying so once they met the SLO again). Where capacity control owns
        replicas it acts on every window here too, and one steady window that meets the SLO ends Infeasible: the
        rate it was declared at has passed. Each re-open at one load asks twice the windows of the last
        (`_met_to_reopen`)."""
        if state.convergence.spec_key and state.convergence.spec_key != self.problem.key:
            return self._save(self._reopened(state, "the spec changed", same_workload=True))
        if state.phase is Phase.DEGRADED and (retried := retry_fit(self.backend, state.current)) is not None:
            # Degraded holds while the retry rolls out: the condition changes once, when the requested count runs.
            return self._save(state.evolve(rollout=state.current, message=retried,
                                           failed_keys=state.learned.failed_keys - {state.current.key()}))
        capacity = self._capacity_on()
        if state.phase is Phase.DEGRADED or not (state.convergence.load_reference or capacity):
            return state
        snapshot = self._window(state)
        if isinstance(snapshot, TuningState):
            return snapshot
        state, steady = self._control_capacity(state, snapshot)
        if not steady or snapshot.num_requests < self.problem.tuning.min_samples:
            return self._save(state)
        if state.phase is Phase.INFEASIBLE:
            met = state.convergence.windows_met + 1 if self.problem.slo.is_met(snapshot) else 0
            reopens = state.convergence.reopens
            if met and met >= self._met_to_reopen(reopens, capacity):
                again = f" in {met} window{'s in a row' if met > 1 else ''}"
                before = f" (re-opened {reopens} time(s) before at this load)" if reopens else ""
                reopened = self._reopened(state, f"every SLO target holds again{again} at this load{before}",
                                          same_workload=True)
                return self._save(reopened.evolve(reopens=reopens + 1))
            state = state.evolve(windows_met=met)
        if not state.convergence.load_reference:
            return self._save(state)
        return self._save(self._watch_load(state, snapshot))

    def _met_to_reopen(self, reopens: int, capacity: bool) -> int:
        """Met windows in a row that end Infeasible at one load: `convergenceWindows` (one where capacity control
        acts), twice as many for every time it re-opened at this load already, up to MAX_REOPEN_BACKOFF times. A
        config at the SLO's edge re-opened every few windows: the workload-shift e2e on a box slower than at its
        calibration went Infeasible -> re-opened -> Infeasible for 15 minutes, each re-open a fresh budget of
        changes the windows before had already shown to be no use."""
        first = 1 if capacity else self.problem.tuning.convergence_windows
        return first * min(2**reopens, MAX_REOPEN_BACKOFF)

    def _watch_load(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        """At rest (Converged or Infeasible, nothing pending), the window's load joins the reference, or, when it
        moved (loop.shift.watch), the shift is recorded and tuning resumes from the current config. Any
        other window ends the rest: the reference is rebuilt when the loop next comes to rest."""
        if state.pending is not None or state.phase not in (Phase.CONVERGED, Phase.INFEASIBLE):
            return state.evolve(load_reference=(), load_held=()) if state.convergence.load_reference else state
        watched = watch(state.convergence.load_reference, state.convergence.load_held, WindowLoad.of(snapshot))
        if watched.shift is None:
            return state.evolve(load_reference=watched.reference, load_held=watched.held)
        return self._shifted(state, watched.shift, snapshot)

    def _shifted(self, state: TuningState, shift: LoadShift, snapshot: MetricsSnapshot) -> TuningState:
        """A workload shift: the history says what moved, by how much and what is done; the loop re-opens."""
        running = state.current.describe()
        done = (f"tuning resumes from {running}; the load fell, so fewer replicas are tried once the SLO holds"
                if shift.fell and shift.statistic == "request rate" else f"tuning resumes from {running}")
        entry = HistoryRecord(iteration=state.iteration, time=now_utc(), knob=None,
                              change=f"workload shift: {shift.statistic} {shift.moved}", reason=shift.describe(),
                              after=Observed.of(snapshot), config=state.current, verdict=Verdict.WORKLOAD_SHIFT,
                              detail=done)
        return self._reopened(state.record(entry), f"{shift.describe()}; {done}", same_workload=False)

    def _reopened(self, state: TuningState, why: str, same_workload: bool) -> TuningState:
        """Tuning again from the current config: what was tried under the old spec or load may work now."""
        return state.evolve(phase=Phase.MEASURING, infeasible=None, settled=False, windows_met=0, windows_missed=0,
                            streak=(), load_reference=(), load_held=(), spec_key="", changes_applied=0,
                            rolled_back_moves=(), tried_keys=frozenset({state.current.key()}), best=None,
                            best_badness=None, prepared_replicas=None, baseline=None, first_after=None, lucky=None,
                            futile_moves=(), reopens=0,
                            spec_acceptance=state.learned.spec_acceptance if same_workload else None,
                            message=f"re-opened: {why}")
