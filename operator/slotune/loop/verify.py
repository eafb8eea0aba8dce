"""The loop's verify step: the window after a change, and what becomes of the change.

Windows are not judged while a capacity increase drains the backlog it inherited (loop.drain), while the quality
gate still probes, or while a canary's arms are too small (pooled with the next window). The verdict is the
judge's (slotune.judge: before/after, or the canary pod against its siblings over the same window), amended by the
policy (slotune.policy.keep); a verdict the machine's drifting speed explains is measured again against a fresh
baseline (loop.rebaseline). A kept change becomes the current config (a canary is promoted to every pod); a rolled
back one restores the previous config, and the window it measured still informs the next decision: headroom after
a failed trim, the squeeze verdict at the roomiest config, or the next change.
"""

from __future__ import annotations

from dataclasses import replace

from slotune.api.status import Phase, Verdict
from slotune.api.tuning import Knob
from slotune.judge.verification import Judgement, verify
from slotune.loop import canary as loop_canary
from slotune.loop import drain, rebaseline
from slotune.loop.apply import pending_change
from slotune.loop.converge import ConvergeStep
from slotune.loop.state import InfeasibleReport, PendingChange, TuningState
from slotune.policy import Infeasible, costs_nothing, describe_change, move_key, squeeze_verdict
from slotune.policy.best_effort import without_targets
from slotune.policy.futile import at_max_replicas, lucky_keep
from slotune.policy.keep import Judged, OneMoreWindow, amended
from slotune.quality.gate import QualityVerdict
from slotune.slo import SLOSpec
from slotune.snapshot import MetricsSnapshot


class VerifyStep(ConvergeStep):
    def _verify(self, state: TuningState, snapshot: MetricsSnapshot) -> tuple[TuningState, bool]:
        """The pending change's window judged: (the state, whether the change was kept and the window is to be
        judged as the kept config's as well)."""
        pending, baseline = state.pending, state.measured.baseline
        assert pending is not None and baseline is not None
        proposal, judged = pending.proposal, self._judged_slo(state)
        if (backlog := drain.draining(pending, baseline, snapshot)) is not None:  # judge the change, not the queue
            return state.evolve(message=drain.describe(pending, backlog), pending=pending.model_copy(update={
                "drain_windows": pending.drain_windows + 1, "drain_backlog": backlog})), False
        if pending.canary_pod is not None:  # the canary pod against its siblings over this same window
            canary = loop_canary.verification(self.source, pending, judged, state.learned.noise_floor)
            if isinstance(canary, loop_canary.Unjudged):
                return self._unjudged_canary(state, pending, canary), False
        verdict = canary if pending.canary_pod is not None else verify(
            baseline, snapshot, proposal.target_metric, proposal.target_percentile, judged,
            costs_nothing=costs_nothing(pending.previous, pending.config), earlier_after=state.measured.first_after)
        quality = (self.quality.check(pending.previous, pending.config, pending.canary_endpoint)
                   if self.quality is not None else None)
        if quality is not None and quality.pending:  # its requests are in this window anyway: judge the next one
            return state.evolve(message=f"{pending.change}: {quality.reason}; the window is not judged"), False
        change = Judged(baseline, snapshot, judged, proposal.target_metric, proposal.target_percentile, proposal.trim,
                        pending.canary_pod is not None, state.measured.first_after,
                        added_replicas=pending.previous.changed_knobs(pending.config) == {"replicas"}
                        and pending.config.replicas > pending.previous.replicas)
        verdict = amended(verdict, change, quality, self.problem.slo, self.problem.tuning.convergence_windows,
                          squeezed=lambda: state.phase is not Phase.INFEASIBLE
                          and self._squeezed(state, pending.config, snapshot))
        if isinstance(verdict, OneMoreWindow):
            return state.evolve(first_after=snapshot, message=f"{pending.change}: {verdict.reason}"), False
        if (drift := rebaseline.speed_drift(self.problem.deployment, pending, baseline, snapshot, verdict)) is not None:
            return self._rebaseline(state, pending, drift, verdict), False
        return self._conclude(state, snapshot, verdict, judged)

    def _judged_slo(self, state: TuningState) -> SLOSpec:
        """Best effort while Infeasible: only the targets still in reach are judged."""
        out_of_reach = state.infeasible.out_of_reach if state.phase is Phase.INFEASIBLE and state.infeasible else ()
        return without_targets(self.problem.slo, out_of_reach) or self.problem.slo

    def _rebaseline(self, state: TuningState, pending: PendingChange, drift: float, verdict: Judgement) -> TuningState:
        """The machine's speed moved with the verdict: the previous config again for a fresh baseline window."""
        baseline = state.measured.baseline
        missed = not pending.proposal.trim and baseline is not None and not self.problem.slo.is_met(baseline)
        again = pending.model_copy(update={"applied": False, "rebaseline": True, "rebaselined": True,
                                           "fixes_miss": missed})
        phase = Phase.INFEASIBLE if state.phase is Phase.INFEASIBLE else Phase.TUNING  # best effort stays so
        return self._restore(state.evolve(pending=again, baseline=None, first_after=None, phase=phase,
                                          message=rebaseline.describe(pending, drift, verdict.reason)),
                             pending.previous)

    def _conclude(self, state: TuningState, snapshot: MetricsSnapshot, verdict: Judgement,
                  judged: SLOSpec) -> tuple[TuningState, bool]:
        """Keep (promote a canary), or roll back."""
        pending, baseline = state.pending, state.measured.baseline
        assert pending is not None and baseline is not None
        earlier, state = state.measured.first_after, state.evolve(first_after=None)
        if pending.canary_pod is not None:
            self.backend.end_canary()  # type: ignore[attr-defined]  # the apply below brings every pod to one config
        if verdict.keep and pending.canary_pod is not None:  # promote; the window mixed both arms: measure again
            entry = self._entry(state, pending, Verdict.KEPT, verdict.reason, snapshot)
            return self._restore(state.record(entry).evolve(pending=None, baseline=None, phase=Phase.TUNING, message=(
                f"promoted {pending.change} from canary pod {pending.canary_pod} to every pod")), pending.config), False
        if verdict.keep:
            entry = self._entry(state, pending, Verdict.KEPT, verdict.reason, snapshot)
            lucky = lucky_keep(verdict, baseline, snapshot, judged, pending.proposal, pending.previous) \
                if not pending.proposal.trim and at_max_replicas(pending.config, self.problem.tuning) else None
            return state.record(entry).evolve(current=pending.config, pending=None, baseline=None, lucky=lucky), True
        return self._rolled_back(state, snapshot, earlier, verdict), False

    def _rolled_back(self, state: TuningState, snapshot: MetricsSnapshot, earlier: MetricsSnapshot | None,
                     verdict: Judgement) -> TuningState:
        pending, baseline = state.pending, state.measured.baseline
        assert pending is not None and baseline is not None
        entry = self._entry(state, pending, Verdict.ROLLED_BACK, verdict.reason, snapshot)
        moves = (*state.learned.rolled_back_moves, move_key(pending.previous, pending.config))
        state = self._restore(state.record(entry).evolve(pending=None, phase=Phase.TUNING, rolled_back_moves=moves,
                                                         message=f"rolled back {pending.change}: {verdict.reason}"),
                              pending.previous)
        if state.phase is Phase.DEGRADED or state.rollout is not None:
            return state  # a rollback still rolling out: the next window of the restored config decides
        if pending.proposal.trim:  # the restored config met the SLO: stay converged, maybe try another saving later
            state = state.evolve(phase=Phase.CONVERGED, message=f"kept {state.current.describe()}: "
                                 f"{pending.change} broke the SLO")
            first_miss = pending.proposal.knob is Knob.REPLICAS and moves.count(moves[-1]) == 1
            return self._headroom(state, pending.config, snapshot) if first_miss else state.evolve(baseline=None)
        if state.phase is not Phase.INFEASIBLE:
            return self._after_rollback(state, pending, baseline, snapshot, earlier)
        # The baseline window still describes the restored config: decide the next change from it right away.
        return self._decide(state.evolve(baseline=None), baseline)

    def _after_rollback(self, state: TuningState, pending: PendingChange, baseline: MetricsSnapshot,
                        snapshot: MetricsSnapshot, earlier: MetricsSnapshot | None) -> TuningState:
        """The rolled-back window measured its own config: at the roomiest one it may say nothing allowed can meet
        the SLO (policy.squeeze_verdict), which the restored baseline's window cannot. Either window of the
        rolled-back config counts: a bursty workload's windows alternate busy and calm batches."""
        if earlier is not None and self._squeezed(state, pending.config, earlier):
            snapshot = earlier
        given = replace(self._policy_input(state, snapshot), config=pending.config)
        diagnosis = self._diagnose(state, pending.config, snapshot)
        squeeze = squeeze_verdict(diagnosis, given)
        if isinstance(squeeze, Infeasible):
            report = InfeasibleReport(closest=squeeze.closest, reason=squeeze.reason, needs=squeeze.needs)
            return self._give_up(state.evolve(baseline=None), report, diagnosis.report("; ".join(squeeze.needs)),
                                 snapshot)
        if squeeze is not None and state.changes_applied < self.problem.tuning.max_iterations:
            proposal = replace(squeeze, change=describe_change(state.current, squeeze.config, squeeze.knob))
            intent = state.evolve(pending=pending_change(proposal, state.current), baseline=baseline,
                                  diagnosis=diagnosis.report(proposal.change),
                                  message=f"trying {proposal.change}: {proposal.reason}")
            return self._apply_pending(self._save(intent))
        # The baseline window still describes the restored config: decide the next change from it right away.
        return self._decide(state.evolve(baseline=None), baseline)

    def _rebaselined(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        """The fresh baseline measured: the candidate again, judged against it (not a new change). A change made for
        a window that missed the SLO is not made at all when the fresh baseline meets every target: the miss was
        the machine's moment, and the change would buy capacity for it (a CI box running other work added a replica
        back after a kept trim that way, kept for a median 1.76x faster while the P95 target held on both sides)."""
        assert state.pending is not None
        if state.pending.fixes_miss and self.problem.slo.is_met(snapshot):
            return self._not_needed(state, snapshot)
        pending = state.pending.model_copy(update={"rebaseline": False})
        applied = self._apply_pending(state.evolve(pending=pending, baseline=snapshot))
        again = applied.pending is not None and applied.pending.applied
        return applied.evolve(changes_applied=state.changes_applied) if again else applied

    def _not_needed(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        """The pending fix given up before it is applied again: the running config's fresh window meets the SLO. It
        was never judged on its merits, so it stays open to a later miss (not among the configs tried)."""
        pending = state.pending
        assert pending is not None
        why = "not needed: the kept config meets every target on a fresh baseline (the miss was the machine's)"
        entry = self._entry(state.evolve(baseline=snapshot), pending, Verdict.ROLLED_BACK, why, snapshot)
        state = state.record(entry).evolve(pending=None, baseline=None, phase=Phase.MEASURING,
                                           tried_keys=state.learned.tried_keys - {pending.config.key()},
                                           changes_applied=max(state.changes_applied - 1, 0),
                                           message=f"{pending.change}: {why}")
        return self._judge(state, snapshot)

    def _unjudged_canary(self, state: TuningState, pending: PendingChange,
                         unjudged: loop_canary.Unjudged) -> TuningState:
        """Too few requests in an arm, or an inconclusive look: the next window, pooled with this one
        (slotune.judge.canary_pool). No series of an arm (the canary pod was replaced): the canary starts again on a
        ready pod, as an intent the next step applies, with its windows forgotten."""
        if not unjudged.lost:
            return state.evolve(pending=pending.model_copy(update={"canary_pool": unjudged.pool}),
                                message=f"{pending.change}: {unjudged.reason}; judging the next window pooled")
        self.backend.end_canary()  # type: ignore[attr-defined]
        return state.evolve(pending=pending.model_copy(update={"applied": False, "canary_pod": None,
                                                               "canary_pool": None}),
                            changes_applied=state.changes_applied - 1,
                            message=f"{pending.change}: canary lost ({unjudged.reason}); starting it again")

    def _canary_quality(self, state: TuningState, quality: QualityVerdict) -> TuningState:
        """The canary's quality gate is still probing its pod (wait: no latency window is judged before it), or
        broke: the canary pod alone goes back to the previous config, before any latency window."""
        pending, baseline = state.pending, state.measured.baseline
        assert pending is not None and baseline is not None
        if quality.pending:
            message = f"{pending.change}: {quality.reason} on canary pod {pending.canary_pod}"
            return state if state.message == message else self._save(state.evolve(message=message))
        self.backend.end_canary()  # type: ignore[attr-defined]
        reason = f"canary verification on pod {pending.canary_pod}, quality judged first: {quality.reason}"
        entry = self._entry(state, pending, Verdict.ROLLED_BACK, reason)
        moves = (*state.learned.rolled_back_moves, move_key(pending.previous, pending.config))
        state = self._restore(state.record(entry).evolve(pending=None, phase=Phase.TUNING, rolled_back_moves=moves,
                                                         message=f"rolled back {pending.change}: {reason}"),
                              pending.previous)
        if state.phase is Phase.DEGRADED or state.rollout is not None:
            return self._save(state)
        return self._save(self._decide(state.evolve(baseline=None), baseline))
