"""The loop's first step: apply. A decided change is saved as an intent before the backend applies it, so a process
killed at any point resumes where it stopped (an unapplied intent is applied again); a rollout still in progress
ends the step; a config that crashes or never serves is rolled back and never tried again. `ApplyStep` holds what
every later step shares (the problem, the backend, the source, the store, the clock) and the history entries.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from slotune.api.status import Observed, Phase, Verdict, Verification
from slotune.api.tuning import TuningMode
from slotune.knobs import RuntimeConfig
from slotune.loop import canary as loop_canary
from slotune.loop.problem import TuningProblem
from slotune.loop.protocols import ApplyResult, Backend, MeasurementSource, StateStore
from slotune.loop.state import HistoryRecord, PendingChange, TuningState, now_utc
from slotune.policy import Proposal
from slotune.quality.gate import QualityProbe, alters_outputs
from slotune.snapshot import MetricsSnapshot


class ApplyStep:
    def __init__(self, problem: TuningProblem, backend: Backend, source: MeasurementSource, store: StateStore,
                 clock: Callable[[], float] = time.time, quality: QualityProbe | None = None) -> None:
        self.problem, self.backend, self.source, self.store, self.clock = problem, backend, source, store, clock
        self.quality = quality  # judges changes that can alter outputs (slotune.quality); None: latency alone
        self.wake_at_s: float | None = None  # when the last step expects the next one to have work (None: soon)
        self._ignored = ""  # this step's window's readings dropped as out of their domain (metrics.domain)

    def _start(self) -> TuningState:
        state = TuningState.initial(self.problem.initial)
        return self._save(self._started(state, self.backend.apply(state.current)))

    def _started(self, state: TuningState, result: ApplyResult) -> TuningState:
        if result.in_progress:
            return state.evolve(rollout=state.current, message=f"deploying {state.current.describe()}: "
                                f"{result.reason}")
        if not result.ok:
            what = "retry failed" if state.phase is Phase.DEGRADED else "initial config failed"
            return state.evolve(phase=Phase.DEGRADED, rollout=None, message=f"{what}: {result.reason}",
                                failed_keys=state.learned.failed_keys | {state.current.key()})
        return state.evolve(phase=Phase.MEASURING, rollout=None, message=self._measuring_message())

    def _measuring_message(self) -> str:
        off = self.problem.tuning.mode is TuningMode.OFF
        return "tuning off: measuring, never changing the config" if off else "measuring the baseline"

    def _await_rollout(self, state: TuningState) -> TuningState:
        """A config asked of the backend earlier (the first one, or a rollback) that did not serve yet."""
        config = state.rollout
        assert config is not None
        result = self.backend.apply(config)
        if result.in_progress:
            if state.message.endswith(result.reason):
                return state
            again = "retrying: " if state.phase is Phase.DEGRADED else ""
            return self._save(state.evolve(message=f"{again}rolling out {config.describe()}: {result.reason}"))
        if state.phase in (Phase.DEPLOYING, Phase.DEGRADED):  # the first rollout, or a Degraded config's retry
            return self._save(self._started(state, result))
        if not result.ok:
            return self._save(state.evolve(rollout=None, phase=Phase.DEGRADED, message=(
                f"rollback to {config.describe()} failed: {result.reason}")))
        return self._save(state.evolve(rollout=None, message=f"running {config.describe()} again"))

    def _apply_pending(self, state: TuningState) -> TuningState:
        pending = state.pending
        assert pending is not None
        # The reference is recorded while the previous config still serves; until it is, the change stays an intent.
        if self.quality is not None and not self.quality.before(pending.previous, pending.config):
            return state.evolve(message=f"recording the quality reference before {pending.change}")
        gated = self.quality is not None and alters_outputs(pending.previous, pending.config)
        canary = loop_canary.start(self.backend, self.source, pending, gated)  # None: verified before/after
        result = canary.result if canary is not None else self.backend.apply(pending.config)
        if result.in_progress:  # stays an unapplied intent: the next step asks the backend again
            return state.evolve(message=f"rolling out {pending.change}: {result.reason}")
        applied = state.changes_applied + 1
        if result.ok:
            if self.quality is not None:  # the candidate's probe run starts now: its verdict is due by the window's
                self.quality.check(pending.previous, pending.config, canary and canary.endpoint)
            on = "" if canary is None else (f" on canary pod {canary.pod} (its siblings keep running "
                                            f"{pending.previous.describe()})")
            return state.evolve(pending=pending.model_copy(update={
                                    "applied": True, "canary_pod": canary and canary.pod,
                                    "canary_endpoint": canary and canary.endpoint}),
                                changes_applied=applied, tried_keys=state.learned.tried_keys | {pending.config.key()},
                                phase=Phase.VERIFYING, cooldown_until_s=self.clock() + self.problem.tuning.cooldown_s,
                                message=f"verifying {pending.change}{on}")
        state = state.record(self._entry(state, pending, Verdict.FAILED, result.reason)).evolve(
            pending=None, changes_applied=applied, failed_keys=state.learned.failed_keys | {pending.config.key()},
            phase=Phase.TUNING, message=f"{pending.change} failed ({result.reason}); rolled back")
        return self._restore(state, pending.previous)

    def _restore(self, state: TuningState, config: RuntimeConfig) -> TuningState:
        result = self.backend.apply(config)
        if result.in_progress:
            return state.evolve(current=config, rollout=config)
        if result.ok:
            return state.evolve(current=config)
        return state.evolve(phase=Phase.DEGRADED, message=f"rollback to {config.describe()} failed: {result.reason}")

    def _entry(self, state: TuningState, pending: PendingChange, verdict: Verdict, detail: str,
               after: MetricsSnapshot | None = None) -> HistoryRecord:
        before = Observed.of(state.measured.baseline) if state.measured.baseline is not None else None
        method = None if verdict is Verdict.FAILED else (
            Verification.CANARY if pending.canary_pod else Verification.BEFORE_AFTER)
        proposal = pending.proposal
        return HistoryRecord(iteration=state.iteration, time=now_utc(), knob=proposal.knob, change=proposal.change,
                             reason=proposal.reason, before=before, after=Observed.of(after) if after else None,
                             config=proposal.config, verdict=verdict, detail=detail, trim=proposal.trim,
                             verification=method)

    def _save(self, state: TuningState) -> TuningState:
        if self._ignored and self._ignored not in state.message:  # said in status whatever the step decided
            state = state.evolve(message=f"{state.message}; {self._ignored}")
        self.store.save(state)
        return state


def pending_change(proposal: Proposal, previous: RuntimeConfig) -> PendingChange:
    return PendingChange(proposal=proposal, previous=previous)
