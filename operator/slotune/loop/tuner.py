"""The tuning loop, written once: measure -> diagnose -> decide -> apply or verify -> keep or roll back -> persist.

One `Tuner.step()` judges one measurement window. State is loaded from and saved to the `StateStore` around every
side effect, and a decided change is saved as an intent before the backend applies it, so a process killed at any
point resumes where it stopped: an unapplied intent is applied again, an applied change is verified by the next
window. Faults: no metrics -> keep the config and say so; a config that crashes or never serves -> roll back to the
previous one and never try it again. After convergence a single bad window does not restart tuning (hysteresis).

A step never waits: a rollout still in progress or a window still open ends the step with the state saved, and
`wake_at_s` says when stepping again is worth it. After a window ends the backend is asked to confirm that every
replica still runs the config the state calls running; a replica that drifted is repaired and the window discarded,
so a verdict is never drawn from a config that did not run. `tuning.mode: off` runs the same step and only reports.

At rest (Converged, Infeasible) every window's measured load is checked against the windows the loop came to rest
on (loop.shift: a stated test per statistic); a shift is recorded in the history and tuning resumes from the
current config with a fresh budget: more capacity or other knobs when the SLO now misses, fewer replicas (the
policy's trims) when the load fell and it still holds.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from slotune.api.spec import TunedModelSpec
from slotune.api.status import DiagnosisReport, Observed, Phase, Verdict, Verification
from slotune.api.tuning import Knob, TuningMode, TuningSpec
from slotune.judge.attainment import as_percentiles, interpolation_evidence, observed
from slotune.judge.slo_bound import CONFIDENCE, bounds, pool, tightened
from slotune.judge.verification import Judgement, verify
from slotune.knobs import RuntimeConfig
from slotune.loop import canary as loop_canary
from slotune.loop import drain, rebaseline
from slotune.loop.protocols import ApplyResult, Backend, MeasurementSource, MetricsUnavailable, StateStore, WindowOpen
from slotune.loop.shift import MAX_REFERENCE, LoadShift, WindowLoad, detect_shift
from slotune.loop.state import HistoryRecord, InfeasibleReport, PendingChange, TuningState, now_utc
from slotune.metrics.domain import checked
from slotune.perfmodel.accelerators import accelerator
from slotune.perfmodel.deployment import Deployment
from slotune.perfmodel.model_profile import ModelProfile
from slotune.perfmodel.window_step import speed_ratio
from slotune.policy import (
    Infeasible,
    PolicyInput,
    Proposal,
    costs_nothing,
    describe_change,
    futile,
    move_key,
    propose,
    propose_headroom,
    propose_trim,
    squeeze_verdict,
)
from slotune.policy.best_effort import without_targets
from slotune.policy.diagnosis import Diagnosis, diagnose, window_acceptance
from slotune.policy.worst_miss import judged_by_worst_miss
from slotune.quality.gate import QualityProbe, QualityVerdict, alters_outputs
from slotune.slo import SLOSpec
from slotune.snapshot import MetricsSnapshot
from slotune.workload import WorkloadSpec

RETUNE_AFTER_MISSED_WINDOWS = 2
MAX_POOLED = 3  # extra met windows pooled to bound a percentile before falling back on point estimates
MAX_STREAK = 4  # latest met windows of one config its bound is judged on
SPEED_WINDOWS = 8  # recent windows whose measured/predicted step time calibrates the profile (their median)
HEADROOM_MAX_MISS = 1.5  # fewer replicas that missed the SLO by more than this are not worth one headroom change


@dataclass(frozen=True)
class TuningProblem:
    """What to tune and against what: the parts of a TunedModel spec the loop reads."""

    slo: SLOSpec
    tuning: TuningSpec
    deployment: Deployment
    initial: RuntimeConfig
    workload: WorkloadSpec | None = None
    draft_model: str | None = None  # spec.model.draftModel: draft_model speculation only with one

    @property
    def key(self) -> str:
        """The SLO and tuning as declared: Infeasible and Degraded re-open when the spec changes them."""
        return self.slo.model_dump_json() + self.tuning.model_dump_json()

    @classmethod
    def from_spec(cls, spec: TunedModelSpec, model: ModelProfile) -> TuningProblem:
        # count is 0 for cpu (no accelerator to request); the roofline still runs on one device.
        deployment = Deployment(model, accelerator(spec.hardware.accelerator.value), max(spec.hardware.count, 1),
                                max_model_len=spec.model.max_model_len or 8192)
        initial = spec.runtime.config.with_changes(replicas=spec.replicas)
        return cls(spec.slo, spec.tuning, deployment, initial, spec.workload, spec.model.draft_model)


def badness(slo: SLOSpec, snapshot: MetricsSnapshot) -> float:
    """The worst observed/target ratio of the window (<= 1 when every latency target holds)."""
    ratios = [r.ratio for r in slo.evaluate(snapshot)]
    if slo.min_throughput is not None:
        ratios.append(slo.min_throughput / max(snapshot.generation_tokens_per_s, 1e-9))
    return max(ratios, default=0.0)


class Tuner:
    def __init__(self, problem: TuningProblem, backend: Backend, source: MeasurementSource, store: StateStore,
                 clock: Callable[[], float] = time.time, quality: QualityProbe | None = None) -> None:
        self.problem, self.backend, self.source, self.store, self.clock = problem, backend, source, store, clock
        self.quality = quality  # judges changes that can alter outputs (slotune.quality); None: latency alone
        self.wake_at_s: float | None = None  # when the last step expects the next one to have work (None: soon)
        self._ignored = ""  # this step's window's readings dropped as out of their domain (metrics.domain)

    # -- public ---------------------------------------------------------------------------------------------------

    def step(self) -> TuningState:
        """Judge one window (or advance a rollout, or finish an interrupted apply). Returns the saved state."""
        self.wake_at_s, self._ignored = None, ""
        state = self.store.load() or self._start()
        if state.rollout is not None:
            state = self._await_rollout(state)
            if state.rollout is not None or state.phase is Phase.DEGRADED:
                return state
        if state.phase in (Phase.INFEASIBLE, Phase.DEGRADED) and state.pending is None:
            return self._reopen_if_changed(state)
        if state.pending is not None and not state.pending.applied and not state.pending.rebaseline:
            return self._save(self._apply_pending(state))
        if (quality := loop_canary.quality_first(self.quality, state.pending)) is not None:
            return self._canary_quality(state, quality)  # judged on the canary pod before any latency window
        if self.clock() < state.cooldown_until_s:
            self.wake_at_s = state.cooldown_until_s
            return state
        snapshot = self._window(state)
        if isinstance(snapshot, TuningState):
            return snapshot
        snapshot, state = self._pool_short(state, snapshot)
        if snapshot.num_requests < self.problem.tuning.min_samples:
            return self._save(state.evolve(metrics_available=True, short=snapshot, short_of=state.running.describe(),
                                           message=(f"{snapshot.num_requests} requests so far, fewer than minSamples "
                                                    f"{self.problem.tuning.min_samples}: pooled with the next window")))
        state = state.evolve(iteration=state.iteration + 1, metrics_available=True,
                             observed=observed(self.problem.slo, snapshot),
                             slo_met=self.problem.slo.is_met(snapshot),
                             speed_ratios=self._speed_ratios(state, snapshot),
                             spec_acceptance=self._measured_acceptance(state, snapshot))
        if self.problem.tuning.mode is TuningMode.OFF:
            return self._save(state.evolve(phase=Phase.MEASURING, message="tuning off: reporting only"))
        if state.pending is not None and state.pending.rebaseline:  # the kept config's fresh baseline (rebaseline)
            return self._save(self._rebaselined(state, snapshot))
        state = state.evolve(noise_floor=loop_canary.observe_noise(self.source, state, self.problem.slo))
        state = self._watch_load(state, snapshot)
        if state.pending is not None:
            state, kept = self._verify(state, snapshot)
            if not kept:
                return self._save(state)
        return self._save(self._judge(state, snapshot))

    def run(self, max_windows: int) -> TuningState:
        """Step until Converged with nothing left to save, Infeasible or Degraded, or `max_windows` windows."""
        state = self.store.load() or self._start()
        for _ in range(max_windows):
            state = self.step()
            if state.at_rest:
                break
        return state

    # -- phases ---------------------------------------------------------------------------------------------------

    def _start(self) -> TuningState:
        state = TuningState.initial(self.problem.initial)
        return self._save(self._started(state, self.backend.apply(state.current)))

    def _started(self, state: TuningState, result: ApplyResult) -> TuningState:
        if result.in_progress:
            return state.evolve(rollout=state.current, message=f"deploying {state.current.describe()}: "
                                f"{result.reason}")
        if not result.ok:
            return state.evolve(phase=Phase.DEGRADED, rollout=None, message=f"initial config failed: {result.reason}",
                                failed_keys=state.failed_keys | {state.current.key()})
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
            return self._save(state.evolve(message=f"rolling out {config.describe()}: {result.reason}"))
        if state.phase is Phase.DEPLOYING:
            return self._save(self._started(state, result))
        if not result.ok:
            return self._save(state.evolve(rollout=None, phase=Phase.DEGRADED, message=(
                f"rollback to {config.describe()} failed: {result.reason}")))
        return self._save(state.evolve(rollout=None, message=f"running {config.describe()} again"))

    def _window(self, state: TuningState) -> MetricsSnapshot | TuningState:
        """The window that just ended, read only if every replica ran the state's running config through it; else
        the state to return (window still open, no metrics, or a replica that drifted)."""
        try:
            snapshot = self.source.measure(self.problem.tuning.window_s)
        except WindowOpen as open_window:
            self.wake_at_s = open_window.ends_at_s
            return state
        except MetricsUnavailable as error:
            return self._save(state.evolve(metrics_available=False,
                                           message=f"metrics unavailable, keeping the current config: {error}"))
        served = self.backend.apply(state.running)
        if not served.ok or served.changed:
            return self._save(self._drifted(state, served))
        check = checked(snapshot)
        if check.snapshot is None:  # a verdict drawn from it would be drawn from a counter reset or a NaN
            return self._save(state.evolve(metrics_available=False, message=f"{check.describe()}; measuring again"))
        self._ignored = check.describe()
        return check.snapshot

    def _pool_short(self, state: TuningState, snapshot: MetricsSnapshot) -> tuple[MetricsSnapshot, TuningState]:
        """Windows too small to judge pool with the next ones of the same config: a slow config serves few requests
        a window (a closed loop at one sequence at a time on busy cores), and discarding each would never judge it."""
        if state.short is None:
            return snapshot, state
        if state.short_of == state.running.describe():
            snapshot = replace(pool(state.short, snapshot), window_s=state.short.window_s + snapshot.window_s)
        return snapshot, state.evolve(short=None, short_of="")

    def _drifted(self, state: TuningState, served: ApplyResult) -> TuningState:
        """After a window, the backend found replicas not running the config the state calls running."""
        running = state.running.describe()
        if served.in_progress:
            return state.evolve(message=f"window discarded: replicas are not all serving {running} "
                                f"({served.reason}); waiting for them")
        if not served.ok:
            return state.evolve(phase=Phase.DEGRADED, message=f"replicas cannot be brought to run {running}: "
                                f"{served.reason}")
        return state.evolve(message=f"window discarded: a replica did not run {running} "
                            f"({served.reason or 'repaired'}); measuring again")

    def _judge(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        state = self._track_best(state, snapshot)
        if state.slo_met:
            return self._confirm(state, snapshot)
        running = state.current.describe()
        confirming = state.phase is Phase.MEASURING and state.windows_met > 0 and state.streak_of == running
        state = self._judge_lucky(state.evolve(settled=False, streak=()), snapshot)
        if state.phase is Phase.CONVERGED and state.windows_missed + 1 < RETUNE_AFTER_MISSED_WINDOWS:
            return state.evolve(windows_missed=state.windows_missed + 1,
                                message="SLO missed once after convergence; retuning only if it misses again")
        # A config that met the SLO in the windows before and misses one while confirming, with nothing left to try,
        # is measured again before Infeasible, as a converged one is before retuning: one window on a busy machine
        # is not evidence. Once per config, so one whose windows alternate met and missed is judged at its second.
        forgive = state.evolve(windows_met=0, forgiven_of=running, message=(
            f"SLO missed in one window after {state.windows_met} met at {running}, with no change left to try: "
            "measuring it again before calling it Infeasible")) if confirming and state.forgiven_of != running else None
        return self._decide(state.evolve(windows_met=0, windows_missed=0), snapshot, forgive=forgive)

    def _judge_lucky(self, state: TuningState, missed: MetricsSnapshot) -> TuningState:
        """A window of a config kept on a met window alone missed: did that change move the windows that miss
        (loop.futile)? Its move is futile at every allowed replica when it did not. Judged once either way."""
        lucky = state.lucky
        if lucky is None:
            return state
        found = futile.futile(lucky, missed) if lucky.config_key == state.current.key() else None
        if found is None:
            return state.evolve(lucky=None)
        why = (f"kept on a window that met, then missed again as before ({found.describe()} against the baseline's "
               f"missed window): {lucky.move} does not move the windows that miss at every allowed replica")
        # The status keeps it where the change is listed, as later messages replace this one.
        history = tuple(h.model_copy(update={"detail": f"{h.detail}; {why}" if h.detail else why})
                        if h.verdict is Verdict.KEPT and h.config.key() == lucky.config_key else h
                        for h in state.history)
        return state.evolve(lucky=None, futile_moves=tuple(dict.fromkeys((*state.futile_moves, lucky.move))),
                            history=history, message=f"{lucky.change}: {why}")

    def _at_max_replicas(self, config: RuntimeConfig) -> bool:
        """Every replica the bounds allow (or no bound: replicas are not the tuner's to add)."""
        most = self.problem.tuning.bounds.max_replicas
        return most is None or config.replicas >= most

    def _confirm(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        """The window meets every target. Converged only once the upper confidence bound of every percentile, over
        the config's streak of met windows pooled, is under its target (slo_bound): a point estimate just under
        the target misses on the next burst. A bound over its target asks for margin: the policy is asked against
        the SLO tightened to where the bound sits."""
        same = state.streak_of == state.current.describe()
        streak = (*(state.streak if same else ()), snapshot)[-MAX_STREAK:]
        met = state.windows_met + 1
        found = bounds(self.problem.slo, streak)
        margins = "; ".join(b.describe() for b in found)
        state = state.evolve(windows_met=met, windows_missed=0, streak=streak, streak_of=state.current.describe())
        too_few = any(b.upper_ms is None for b in found) and met < self.problem.tuning.convergence_windows + MAX_POOLED
        if met < self.problem.tuning.convergence_windows or too_few:
            return state.evolve(phase=Phase.CONVERGED if state.phase is Phase.CONVERGED else Phase.MEASURING,
                                message=f"every SLO target holds ({met} window(s), confirming): {margins}")
        if all(b.holds or b.upper_ms is None for b in found):  # None: windows too small to bound, even pooled
            diagnosis = self._diagnose(state, state.current, snapshot).report()
            unbounded = [b.target.name for b in found if b.upper_ms is None]
            claim = (f"with {CONFIDENCE:.0%} confidence" if not unbounded else
                     f"in {met} windows, by point estimate for {', '.join(unbounded)} (too few requests to bound "
                     f"at {CONFIDENCE:.0%} confidence)")
            state = state.evolve(phase=Phase.CONVERGED, diagnosis=diagnosis, lucky=None,  # proven beyond luck
                                 message=f"every SLO target holds {claim}: {margins}",
                                 load_reference=state.load_reference if state.phase is Phase.CONVERGED else
                                 tuple(WindowLoad.of(w) for w in streak))  # the windows it came to rest on
            return self._trim(state, snapshot)
        if len(streak) < MAX_STREAK:
            # Every window met the SLO but the bound misses: measure up to MAX_STREAK windows before a change for
            # margin. From two or three windows the next window's bound is mostly the noise of their spread
            # (t(0.9, 1) = 3.1), and the pooled tail's bound tightens with samples: a change for margin now would
            # buy capacity for the estimate's noise (at 0.9 without this wait, 5 of 17 feasible benchmark
            # scenarios ended on a replica more than the oracle, one of them called Infeasible).
            return state.evolve(phase=Phase.CONVERGED if state.phase is Phase.CONVERGED else Phase.MEASURING,
                                message=f"every SLO target holds in {len(streak)} window(s), not yet with "
                                f"confidence: measuring more before a change for margin: {margins}")
        pooled = functools.reduce(pool, streak)
        tight = tightened(self.problem.slo, found)
        if tight.is_met(pooled) or state.changes_applied >= self.problem.tuning.max_iterations:
            return state.evolve(phase=Phase.MEASURING, message=f"every SLO target holds, without margin: {margins}")
        margin_state = state.evolve(windows_met=0, streak=(), settled=False,
                                    message=f"every SLO target holds, without margin: {margins}")
        return self._decide(margin_state, pooled, tight)

    def _decide(self, state: TuningState, snapshot: MetricsSnapshot, slo: SLOSpec | None = None,
                forgive: TuningState | None = None) -> TuningState:
        """`slo`: the SLO to decide against (the declared one, or it tightened for margin); a target missed by
        attainment alone reaches the policy as a percentile that misses (loop.attainment.as_percentiles).
        `forgive`: the state to return instead of Infeasible (a missed window after met ones, see _judge)."""
        slo = slo or as_percentiles(self.problem.slo, snapshot)
        diagnosis = self._diagnose(state, state.current, snapshot, slo)
        if diagnosis.primary is None:  # a margin change rolled back: its baseline met every target, measure again
            return state.evolve(phase=Phase.MEASURING, message=f"{state.message}; measuring again")
        if state.changes_applied >= self.problem.tuning.max_iterations:
            # Already Infeasible on the evidence (best effort spent the budget): the evidence stays the reason, what
            # is missing stays named; the budget running out is not why the SLO cannot be met.
            earlier = state.infeasible if state.phase is Phase.INFEASIBLE else None
            report = earlier.model_copy(update={"closest": state.best or state.current}) if earlier else \
                InfeasibleReport(closest=state.best or state.current,
                                 reason=f"maxIterations ({state.changes_applied}) reached",
                                 needs=("a larger maxIterations, or the changes listed in the history",))
            return self._give_up(state, report, diagnosis.report(), snapshot)
        decision = propose(diagnosis, replace(self._policy_input(state, snapshot, revisit_kept=True), slo=slo))
        if isinstance(decision, Infeasible):
            if forgive is not None:
                return forgive
            report = InfeasibleReport(closest=decision.closest, reason=decision.reason, needs=decision.needs,
                                      out_of_reach=decision.out_of_reach)
            return self._give_up(state, report, diagnosis.report("; ".join(decision.needs)), snapshot,
                                 decision.best_effort)
        pending = _pending(decision, state.current)
        intent = state.evolve(phase=Phase.TUNING, pending=pending, baseline=snapshot,
                              diagnosis=diagnosis.report(decision.change), message=f"trying {decision.change}")
        return self._apply_pending(self._save(intent))

    def _trim(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        """Converged: try one cost-saving change (see policy.propose_trim) while budget remains."""
        if state.changes_applied >= self.problem.tuning.max_iterations:
            return state.evolve(settled=True)
        trim = propose_trim(self._policy_input(state, snapshot))
        state = state.evolve(prepared_replicas=None)  # offered first this once
        if trim is None:
            return state.evolve(settled=True)
        pending = _pending(trim, state.current)
        intent = state.evolve(pending=pending, baseline=snapshot, message=f"SLO holds; saving cost: {trim.change}")
        return self._apply_pending(self._save(intent))

    def _headroom(self, state: TuningState, fewer: RuntimeConfig, window: MetricsSnapshot) -> TuningState:
        """Fewer replicas broke the SLO once: make the change that window calls for here, where the SLO holds
        (see policy.propose_headroom), then try the fewer replicas again. The baseline stays: it is this config's."""
        near_miss = badness(self.problem.slo, window) <= HEADROOM_MAX_MISS
        if not near_miss or state.changes_applied >= self.problem.tuning.max_iterations:
            return state.evolve(baseline=None)
        failed = replace(self._policy_input(state, window), config=fewer)
        proposal = propose_headroom(self._diagnose(state, fewer, window), failed, state.current)
        if proposal is None:
            return state.evolve(baseline=None)
        pending = _pending(proposal, state.current)
        intent = state.evolve(pending=pending, prepared_replicas=fewer.replicas,
                              message=f"SLO holds; headroom for {fewer.replicas} replicas: {proposal.change}")
        return self._apply_pending(self._save(intent))

    def _policy_input(self, state: TuningState, snapshot: MetricsSnapshot, revisit_kept: bool = False) -> PolicyInput:
        """`revisit_kept`: a fix (not a trim) may give back replicas a kept trim shed (the same config with more
        replicas, kept before), when the load needs them again; nothing else is revisited, so nothing flaps."""
        excluded = state.failed_keys | state.tried_keys
        if revisit_kept:
            current = state.current
            excluded -= {h.config.key() for h in state.history if h.verdict is Verdict.KEPT
                         and h.config.replicas > current.replicas
                         and h.config == current.with_changes(replicas=h.config.replicas)}
        futile_moves = frozenset(state.futile_moves) if self._at_max_replicas(state.current) else frozenset()
        return PolicyInput(state.current, snapshot, self.problem.slo, self.problem.tuning, self._deployment(state),
                           excluded, state.rolled_back_moves, state.best, self.problem.workload,
                           state.prepared_replicas, state.spec_acceptance, self.problem.draft_model, futile_moves)

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
                                changes_applied=applied, tried_keys=state.tried_keys | {pending.config.key()},
                                phase=Phase.VERIFYING, cooldown_until_s=self.clock() + self.problem.tuning.cooldown_s,
                                message=f"verifying {pending.change}{on}")
        state = state.record(self._entry(state, pending, Verdict.FAILED, result.reason)).evolve(
            pending=None, changes_applied=applied, failed_keys=state.failed_keys | {pending.config.key()},
            phase=Phase.TUNING, message=f"{pending.change} failed ({result.reason}); rolled back")
        return self._restore(state, pending.previous)

    def _verify(self, state: TuningState, snapshot: MetricsSnapshot) -> tuple[TuningState, bool]:
        pending, baseline = state.pending, state.baseline
        assert pending is not None and baseline is not None
        out_of_reach = state.infeasible.out_of_reach if state.phase is Phase.INFEASIBLE and state.infeasible else ()
        judged = without_targets(self.problem.slo, out_of_reach) or self.problem.slo  # best effort: what is in reach
        if (backlog := drain.draining(pending, baseline, snapshot)) is not None:  # judge the change, not the queue
            return state.evolve(message=drain.describe(pending, backlog), pending=pending.model_copy(update={
                "drain_windows": pending.drain_windows + 1, "drain_backlog": backlog})), False
        if pending.canary_pod is not None:  # the canary pod against its siblings over this same window
            canary = loop_canary.verification(self.source, pending, judged, state.noise_floor)
            if isinstance(canary, loop_canary.Unjudged):
                return self._unjudged_canary(state, pending, canary), False
        verdict = canary if pending.canary_pod is not None else verify(
            baseline, snapshot, pending.target_metric, pending.target_percentile, judged,
            costs_nothing=costs_nothing(pending.previous, pending.config), earlier_after=state.first_after)
        quality = (self.quality.check(pending.previous, pending.config, pending.canary_endpoint)
                   if self.quality is not None else None)
        if quality is not None and quality.pending:  # its requests are in this window anyway: judge the next one
            return state.evolve(message=f"{pending.change}: {quality.reason}; the window is not judged"), False
        if pending.canary_pod is None and not pending.trim:
            verdict = judged_by_worst_miss(verdict, baseline, snapshot, judged, pending.target_metric,
                                           pending.target_percentile)
        verdict = self._with_quality(verdict, quality)
        if pending.trim:
            met = self.problem.slo.is_met(snapshot)
            if met and state.first_after is None and self.problem.tuning.convergence_windows > 1:
                # A saving is kept only if the SLO holds over consecutive windows, as convergence itself requires:
                # one window that happens to be kind must not shed a replica the next burst needs.
                return state.evolve(first_after=snapshot, message=(
                    f"{pending.change}: SLO holds; confirming over one more window")), False
            verdict = replace(verdict, keep=met, reason="SLO still holds" if met else f"SLO broken: {verdict.reason}")
        elif (verdict.inconclusive and state.first_after is None and pending.canary_pod is None
              and (state.phase is Phase.INFEASIBLE or not self._squeezed(state, pending.config, snapshot))):
            # One window of a tail percentile is a noisy estimate: a change that moved it the right way, and made
            # nothing worse, earns one more window before the verdict (both windows pooled); not one that already
            # measured the squeeze at the roomiest config (policy.squeeze_verdict), whichever way it moved.
            return state.evolve(first_after=snapshot, message=(
                f"{pending.change}: {verdict.reason}; measuring one more window before deciding")), False
        if (drift := rebaseline.speed_drift(self.problem.deployment, pending, baseline, snapshot, verdict)) is not None:
            again = pending.model_copy(update={"applied": False, "rebaseline": True, "rebaselined": True})
            phase = Phase.INFEASIBLE if state.phase is Phase.INFEASIBLE else Phase.TUNING  # best effort stays so
            return self._restore(state.evolve(pending=again, baseline=None, first_after=None, phase=phase,
                                              message=rebaseline.describe(pending, drift, verdict.reason)),
                                 pending.previous), False
        earlier, state = state.first_after, state.evolve(first_after=None)
        if pending.canary_pod is not None:
            self.backend.end_canary()  # type: ignore[attr-defined]  # the apply below brings every pod to one config
        if verdict.keep and pending.canary_pod is not None:  # promote; the window mixed both arms: measure again
            entry = self._entry(state, pending, Verdict.KEPT, verdict.reason, snapshot)
            return self._restore(state.record(entry).evolve(pending=None, baseline=None, phase=Phase.TUNING, message=(
                f"promoted {pending.change} from canary pod {pending.canary_pod} to every pod")), pending.config), False
        if verdict.keep:
            entry = self._entry(state, pending, Verdict.KEPT, verdict.reason, snapshot)
            lucky = futile.lucky_keep(verdict, baseline, snapshot, judged, pending.knob, pending.change,
                                      pending.previous, pending.config, pending.target_metric,
                                      pending.target_percentile) \
                if not pending.trim and self._at_max_replicas(pending.config) else None
            return state.record(entry).evolve(current=pending.config, pending=None, baseline=None, lucky=lucky), True
        entry = self._entry(state, pending, Verdict.ROLLED_BACK, verdict.reason, snapshot)
        moves = (*state.rolled_back_moves, move_key(pending.previous, pending.config))
        state = self._restore(state.record(entry).evolve(pending=None, phase=Phase.TUNING, rolled_back_moves=moves,
                                                         message=f"rolled back {pending.change}: {verdict.reason}"),
                              pending.previous)
        if state.phase is Phase.DEGRADED or state.rollout is not None:
            return state, False  # a rollback still rolling out: the next window of the restored config decides
        if pending.trim:  # the restored config met the SLO: stay converged, maybe try another saving later
            state = state.evolve(phase=Phase.CONVERGED, message=f"kept {state.current.describe()}: "
                                 f"{pending.change} broke the SLO")
            first_miss = pending.knob is Knob.REPLICAS and moves.count(moves[-1]) == 1
            return (self._headroom(state, pending.config, snapshot) if first_miss else
                    state.evolve(baseline=None)), False
        # The rolled-back window measured its own config: at the roomiest one it may say nothing allowed can meet
        # the SLO (policy.squeeze_verdict), which the restored baseline's window cannot.
        if state.phase is not Phase.INFEASIBLE:
            # Either window of the rolled-back config: a bursty workload's windows alternate busy and calm batches.
            if earlier is not None and self._squeezed(state, pending.config, earlier):
                snapshot = earlier
            given = replace(self._policy_input(state, snapshot), config=pending.config)
            diagnosis = self._diagnose(state, pending.config, snapshot)
            squeeze = squeeze_verdict(diagnosis, given)
            if isinstance(squeeze, Infeasible):
                report = InfeasibleReport(closest=squeeze.closest, reason=squeeze.reason, needs=squeeze.needs)
                return self._give_up(state.evolve(baseline=None), report,
                                     diagnosis.report("; ".join(squeeze.needs)), snapshot), False
            if squeeze is not None and state.changes_applied < self.problem.tuning.max_iterations:
                proposal = replace(squeeze, change=describe_change(state.current, squeeze.config, squeeze.knob))
                intent = state.evolve(pending=_pending(proposal, state.current), baseline=baseline,
                                      diagnosis=diagnosis.report(proposal.change),
                                      message=f"trying {proposal.change}: {proposal.reason}")
                return self._apply_pending(self._save(intent)), False
        # The baseline window still describes the restored config: decide the next change from it right away.
        return self._decide(state.evolve(baseline=None), baseline), False

    def _rebaselined(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        """The fresh baseline measured: the candidate again, judged against it (not a new change)."""
        assert state.pending is not None
        pending = state.pending.model_copy(update={"rebaseline": False})
        applied = self._apply_pending(state.evolve(pending=pending, baseline=snapshot))
        again = applied.pending is not None and applied.pending.applied
        return applied.evolve(changes_applied=state.changes_applied) if again else applied

    def _squeezed(self, state: TuningState, config: RuntimeConfig, snapshot: MetricsSnapshot) -> bool:
        """Whether this window of `config` measured the squeeze at the roomiest config, or one but for the last
        change that reaches it (policy.squeeze_verdict)."""
        given = replace(self._policy_input(state, snapshot), config=config)
        return squeeze_verdict(self._diagnose(state, config, snapshot), given) is not None

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
        pending, baseline = state.pending, state.baseline
        assert pending is not None and baseline is not None
        if quality.pending:
            message = f"{pending.change}: {quality.reason} on canary pod {pending.canary_pod}"
            return state if state.message == message else self._save(state.evolve(message=message))
        self.backend.end_canary()  # type: ignore[attr-defined]
        reason = f"canary verification on pod {pending.canary_pod}, quality judged first: {quality.reason}"
        entry = self._entry(state, pending, Verdict.ROLLED_BACK, reason)
        moves = (*state.rolled_back_moves, move_key(pending.previous, pending.config))
        state = self._restore(state.record(entry).evolve(pending=None, phase=Phase.TUNING, rolled_back_moves=moves,
                                                         message=f"rolled back {pending.change}: {reason}"),
                              pending.previous)
        if state.phase is Phase.DEGRADED or state.rollout is not None:
            return self._save(state)
        return self._save(self._decide(state.evolve(baseline=None), baseline))

    @staticmethod
    def _with_quality(verdict: Judgement, quality: QualityVerdict | None) -> Judgement:
        """A change that can alter outputs is kept only if the quality gate holds as well; one that breaks it is
        rolled back at once (a quality regression, never inconclusive), its numbers in the history."""
        if quality is None:
            return verdict
        if not quality.keep:
            reason = quality.reason if verdict.keep else f"{quality.reason}; {verdict.reason}"
            return replace(verdict, keep=False, reason=reason, regressions=(*verdict.regressions, "quality"))
        return replace(verdict, reason=f"{verdict.reason}; {quality.reason}")

    def _restore(self, state: TuningState, config: RuntimeConfig) -> TuningState:
        result = self.backend.apply(config)
        if result.in_progress:
            return state.evolve(current=config, rollout=config)
        if result.ok:
            return state.evolve(current=config)
        return state.evolve(phase=Phase.DEGRADED, message=f"rollback to {config.describe()} failed: {result.reason}")

    def _give_up(self, state: TuningState, report: InfeasibleReport, diagnosis_report: DiagnosisReport,
                 window: MetricsSnapshot, best_effort: Proposal | None = None) -> TuningState:
        """Infeasible: say so and why. A best-effort change (the targets still in reach) is still made, verified
        like any other while the phase stays Infeasible; with none left, the closest config is restored and the
        loop rests until the spec or the measured workload changes (`_reopen_if_changed`)."""
        state = state.evolve(phase=Phase.INFEASIBLE, infeasible=report, diagnosis=diagnosis_report,
                             message=f"infeasible: {report.reason}; needs: {'; '.join(report.needs)}",
                             load_reference=(WindowLoad.of(window),), spec_key=self.problem.key)
        if best_effort is not None and state.changes_applied < self.problem.tuning.max_iterations:
            intent = state.evolve(pending=_pending(best_effort, state.current), baseline=window,
                                  message=f"{state.message}; meanwhile {best_effort.reason}: {best_effort.change}")
            applied = self._apply_pending(self._save(intent))
            return applied.evolve(phase=Phase.INFEASIBLE) if applied.pending is not None else applied
        if report.closest != state.current:
            state = self._restore(state, report.closest)
        return state

    def _reopen_if_changed(self, state: TuningState) -> TuningState:
        """Infeasible and Degraded hold until the spec changes, or (Infeasible) a window shows another workload:
        request rate, prompt or output lengths, or prefix-cache hit rate moved (loop.shift)."""
        if state.spec_key and state.spec_key != self.problem.key:
            return self._save(self._reopened(state, "the spec changed", same_workload=True))
        if state.phase is Phase.DEGRADED or not state.load_reference:
            return state
        snapshot = self._window(state)
        if isinstance(snapshot, TuningState):
            return snapshot
        if snapshot.num_requests < self.problem.tuning.min_samples:
            return state
        return self._save(self._watch_load(state, snapshot))

    def _watch_load(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        """At rest (Converged or Infeasible, nothing pending), the window's load joins the reference, or, when it
        moved (loop.shift.detect_shift), the shift is recorded and tuning resumes from the current config. Any
        other window ends the rest: the reference is rebuilt when the loop next comes to rest."""
        if state.pending is not None or state.phase not in (Phase.CONVERGED, Phase.INFEASIBLE):
            return state.evolve(load_reference=()) if state.load_reference else state
        load = WindowLoad.of(snapshot)
        shift = detect_shift(state.load_reference, load)
        if shift is None:
            return state.evolve(load_reference=(*state.load_reference, load)[-MAX_REFERENCE:])
        return self._shifted(state, shift, snapshot)

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
                            streak=(), load_reference=(), spec_key="", changes_applied=0, rolled_back_moves=(),
                            tried_keys=frozenset({state.current.key()}), best=None, best_badness=None,
                            prepared_replicas=None, baseline=None, first_after=None, lucky=None, futile_moves=(),
                            spec_acceptance=state.spec_acceptance if same_workload else None,
                            message=f"re-opened: {why}")

    # -- helpers --------------------------------------------------------------------------------------------------

    def _diagnose(self, state: TuningState, config: RuntimeConfig, snapshot: MetricsSnapshot,
                  slo: SLOSpec | None = None) -> Diagnosis:
        diagnosis = diagnose(snapshot, config, slo or self.problem.slo, self._deployment(state), self.problem.workload,
                             self.problem.tuning, state.spec_acceptance, self.problem.draft_model)
        if buckets := interpolation_evidence(self.problem.slo, snapshot):
            diagnosis = replace(diagnosis, evidence=(*diagnosis.evidence, *buckets))
        if not state.speed_ratios:
            return diagnosis
        speed = (f"steps take x{statistics.median(state.speed_ratios):.2f} the profile's time (median of "
                 f"{len(state.speed_ratios)} window(s)); floors and sizes use the measured speed")
        return replace(diagnosis, evidence=(*diagnosis.evidence, speed))

    @staticmethod
    def _measured_acceptance(state: TuningState, snapshot: MetricsSnapshot) -> float | None:
        """The workload's per-token draft acceptance once a window that speculated measured it; None before (the
        prior is not a measurement: the policy tells the two apart, e.g. before declaring drafts no help)."""
        if state.running.speculative is None or snapshot.spec_acceptance_rate is None:
            return state.spec_acceptance
        return window_acceptance(snapshot, state.running, state.spec_acceptance)

    def _deployment(self, state: TuningState) -> Deployment:
        """The deployment as measured: its profile, slowed or sped up by the recent windows' median step-time
        ratio (perfmodel.window_step), so sizes and floors follow the hardware actually serving."""
        if not state.speed_ratios:
            return self.problem.deployment
        return self.problem.deployment.slower(statistics.median(state.speed_ratios))

    def _speed_ratios(self, state: TuningState, snapshot: MetricsSnapshot) -> tuple[float, ...]:
        ratio = speed_ratio(self.problem.deployment, state.running, snapshot)
        return state.speed_ratios if ratio is None else (*state.speed_ratios, ratio)[-SPEED_WINDOWS:]

    def _track_best(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        """The closest config so far: the least worst observed/target ratio, over the targets still in reach once
        some are known to be out of it (so best effort on the others counts)."""
        out_of_reach = state.infeasible.out_of_reach if state.infeasible is not None else ()
        score = badness(without_targets(self.problem.slo, out_of_reach) or self.problem.slo, snapshot)
        if state.best is None or state.best == state.current or score < (state.best_badness or float("inf")):
            return state.evolve(best=state.current, best_badness=score)
        return state

    def _entry(self, state: TuningState, pending: PendingChange, verdict: Verdict, detail: str,
               after: MetricsSnapshot | None = None) -> HistoryRecord:
        before = Observed.of(state.baseline) if state.baseline is not None else None
        method = None if verdict is Verdict.FAILED else (
            Verification.CANARY if pending.canary_pod else Verification.BEFORE_AFTER)
        return HistoryRecord(iteration=state.iteration, time=now_utc(), knob=pending.knob, change=pending.change,
                             reason=pending.reason, before=before, after=Observed.of(after) if after else None,
                             config=pending.config, verdict=verdict, detail=detail, trim=pending.trim,
                             verification=method)

    def _save(self, state: TuningState) -> TuningState:
        if self._ignored and self._ignored not in state.message:  # said in status whatever the step decided
            state = state.evolve(message=f"{state.message}; {self._ignored}")
        self.store.save(state)
        return state


def _pending(proposal: Proposal, previous: RuntimeConfig) -> PendingChange:
    return PendingChange(config=proposal.config, previous=previous, knob=proposal.knob, change=proposal.change,
                         reason=proposal.reason, target_metric=proposal.target_metric,
                         target_percentile=proposal.target_percentile, trim=proposal.trim)
