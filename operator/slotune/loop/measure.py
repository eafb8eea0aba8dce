"""The loop's second step: measure. The window that just ended is read only if every replica ran the config the state
calls running through it (a replica that drifted is repaired and the window discarded, so a verdict is never drawn
from a config that did not run); a window with values outside their domain is discarded, or those values dropped
(slotune.metrics.domain), and the status says which; no metrics keeps the config and says so; windows too small to
judge pool with the next ones of the same config. Each judged window also calibrates the performance model (the
measured step speed) and the draft acceptance, and is diagnosed (slotune.policy.diagnosis) against the deployment as
measured.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from slotune.api.status import Phase
from slotune.judge.attainment import interpolation_evidence, observed
from slotune.judge.slo_bound import pool
from slotune.knobs import RuntimeConfig
from slotune.loop.apply import ApplyStep
from slotune.loop.protocols import ApplyResult, MetricsUnavailable, WindowOpen, replica_counts
from slotune.loop.state import TuningState
from slotune.metrics.domain import checked
from slotune.perfmodel.deployment import Deployment
from slotune.perfmodel.window_step import speed_ratio
from slotune.policy.diagnosis import Diagnosis, diagnose, window_acceptance
from slotune.slo import SLOSpec
from slotune.snapshot import MetricsSnapshot

SPEED_WINDOWS = 8  # recent windows whose measured/predicted step time calibrates the profile (their median)


class MeasureStep(ApplyStep):
    def _measured(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        """A window large enough to judge: counted, reported, and folded into the measured speed and acceptance."""
        return state.evolve(iteration=state.iteration + 1, metrics_available=True,
                            observed=observed(self.problem.slo, snapshot),
                            slo_met=self.problem.slo.is_met(snapshot),
                            speed_ratios=self._speed_ratios(state, snapshot),
                            spec_acceptance=self._measured_acceptance(state, snapshot))

    def _too_short(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        return state.evolve(metrics_available=True, short=snapshot, short_of=state.running.describe(),
                            message=(f"{snapshot.num_requests} requests so far, fewer than minSamples "
                                     f"{self.problem.tuning.min_samples}: pooled with the next window"))

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
        if served.in_progress and replica_counts(self.backend, state.running).starting > 0 and state.capacity:
            return snapshot  # replicas capacity control ordered are starting: its window, not the search's
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
        short = state.measured.short
        if short is None:
            return snapshot, state
        if state.measured.short_of == state.running.describe():
            snapshot = replace(pool(short, snapshot), window_s=short.window_s + snapshot.window_s)
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

    def _diagnose(self, state: TuningState, config: RuntimeConfig, snapshot: MetricsSnapshot,
                  slo: SLOSpec | None = None) -> Diagnosis:
        diagnosis = diagnose(snapshot, config, slo or self.problem.slo, self._deployment(state), self.problem.workload,
                             self.problem.tuning, state.learned.spec_acceptance, self.problem.draft_model)
        if buckets := interpolation_evidence(self.problem.slo, snapshot):
            diagnosis = replace(diagnosis, evidence=(*diagnosis.evidence, *buckets))
        if not state.learned.speed_ratios:
            return diagnosis
        speed = (f"steps take x{statistics.median(state.learned.speed_ratios):.2f} the profile's time (median of "
                 f"{len(state.learned.speed_ratios)} window(s)); floors and sizes use the measured speed")
        return replace(diagnosis, evidence=(*diagnosis.evidence, speed))

    @staticmethod
    def _measured_acceptance(state: TuningState, snapshot: MetricsSnapshot) -> float | None:
        """The workload's per-token draft acceptance once a window that speculated measured it; None before (the
        prior is not a measurement: the policy tells the two apart, e.g. before declaring drafts no help)."""
        if state.running.speculative is None or snapshot.spec_acceptance_rate is None:
            return state.learned.spec_acceptance
        return window_acceptance(snapshot, state.running, state.learned.spec_acceptance)

    def _deployment(self, state: TuningState) -> Deployment:
        """The deployment as measured: its profile, slowed or sped up by the recent windows' median step-time
        ratio (perfmodel.window_step), so sizes and floors follow the hardware actually serving."""
        if not state.learned.speed_ratios:
            return self.problem.deployment
        return self.problem.deployment.slower(statistics.median(state.learned.speed_ratios))

    def _speed_ratios(self, state: TuningState, snapshot: MetricsSnapshot) -> tuple[float, ...]:
        ratio = speed_ratio(self.problem.deployment, state.running, snapshot)
        return state.learned.speed_ratios if ratio is None else (*state.learned.speed_ratios, ratio)[-SPEED_WINDOWS:]
