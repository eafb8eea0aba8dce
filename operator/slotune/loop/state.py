"""The tuning state machine's memory: one frozen, JSON-serialisable `TuningState` per tuned deployment.

Everything the loop needs to resume after a restart lives here: the phase, the config running and the best one, the
window every change is compared against (with its samples, for confidence intervals), the change awaiting
verification, configs never to try again, the convergence counter and the cooldown deadline. The operator keeps it
next to the resource's status, local mode in a file; `to_status` renders the user-facing `TunedModelStatus`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

from slotune.api.status import (
    MAX_HISTORY,
    Canary,
    CapacityStatus,
    DiagnosisReport,
    HistoryEntry,
    Observed,
    Phase,
    TunedModelStatus,
    Verdict,
    Verification,
)
from slotune.api.tuning import Knob
from slotune.judge.canary_noise import NoiseFloor
from slotune.judge.canary_pool import CanaryPool
from slotune.knobs import RuntimeConfig
from slotune.loop.shift import WindowLoad
from slotune.policy.capacity import CapacityState
from slotune.policy.futile import LuckyKeep
from slotune.snapshot import LatencyMetric, MetricsSnapshot


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")


class PendingChange(_Frozen):
    """A change decided on. `applied` is False between deciding and the backend confirming it (crash-safe intent)."""

    config: RuntimeConfig
    previous: RuntimeConfig
    knob: Knob
    change: str
    reason: str
    target_metric: LatencyMetric
    target_percentile: int
    trim: bool = False  # made while the SLO held, to save cost: kept only if it still holds
    applied: bool = False
    canary_pod: str | None = None  # verified as a canary: this pod runs `config`, its siblings `previous`
    canary_pool: CanaryPool | None = None  # the canary's inconclusive windows so far, both arms pooled
    canary_endpoint: str | None = None  # the canary pod's OpenAI endpoint: the quality gate probes it alone
    drain_windows: int = 0  # windows not judged while a capacity increase drained the old backlog (loop.drain)
    drain_backlog: float | None = None  # the last such window's mean waiting requests, all replicas
    rebaseline: bool = False  # the machine's speed drifted: the previous config serves a fresh baseline window first
    rebaselined: bool = False  # measured against a fresh baseline once already (loop.rebaseline)


class HistoryRecord(_Frozen):
    iteration: int
    time: datetime
    knob: Knob | None
    change: str
    reason: str
    before: Observed | None = None
    after: Observed | None = None
    config: RuntimeConfig
    verdict: Verdict
    detail: str = ""
    trim: bool = False  # a cost-saving change made while the SLO held
    verification: Verification | None = None  # how a Kept or RolledBack verdict was reached


class InfeasibleReport(_Frozen):
    closest: RuntimeConfig
    reason: str
    needs: tuple[str, ...]
    out_of_reach: tuple[str, ...] = ()  # targets no allowed config can meet: best effort works on the others


class TuningState(_Frozen):
    phase: Phase = Phase.PENDING
    iteration: int = 0  # windows judged
    changes_applied: int = 0
    current: RuntimeConfig
    best: RuntimeConfig | None = None
    best_badness: float | None = None  # worst observed/target ratio of the best config's window (<= 1: met)
    baseline: MetricsSnapshot | None = None  # the window the pending change is compared against
    pending: PendingChange | None = None
    rollout: RuntimeConfig | None = None  # asked of the backend (first deploy, rollback), not serving yet
    first_after: MetricsSnapshot | None = None  # an inconclusive first window of the pending change (pooled next)
    short: MetricsSnapshot | None = None  # windows under minSamples so far, pooled until they reach it
    short_of: str = ""  # the config (described) that served `short`
    history: tuple[HistoryRecord, ...] = ()
    failed_keys: frozenset[str] = frozenset()  # crashed or never ready: never again
    tried_keys: frozenset[str] = frozenset()  # applied before (kept or rolled back): not revisited
    rolled_back_moves: tuple[str, ...] = ()  # knob settings that did not help, once per rollback (policy.move_key)
    settled: bool = False  # converged with no cost-saving change left to try
    prepared_replicas: int | None = None  # a headroom change was made so this replica count can hold: try it next
    speed_ratios: tuple[float, ...] = ()  # recent windows' measured / profiled step time (perfmodel.window_step)
    spec_acceptance: float | None = None  # per-token draft acceptance measured on this workload (None: never)
    noise_floor: NoiseFloor | None = None  # the pods' A/A spread, from windows without a canary (canary_noise)
    streak: tuple[MetricsSnapshot, ...] = ()  # the latest windows of the current config's met streak (slo_bound)
    streak_of: str = ""  # the config (described) whose windows `streak` holds
    load_reference: tuple[WindowLoad, ...] = ()  # the load of the windows since it came to rest (loop.shift)
    spec_key: str = ""  # the SLO and tuning it came to rest under: a spec change re-opens Infeasible and Degraded
    windows_met: int = 0
    windows_missed: int = 0  # consecutive violations after convergence (hysteresis before retuning)
    forgiven_of: str = ""  # the config (described) whose one missed window while confirming was measured again
    lucky: LuckyKeep | None = None  # the last change, kept on a met window alone: re-judged on its next miss
    futile_moves: tuple[str, ...] = ()  # at every allowed replica, knob moves that did not move the windows that miss
    capacity: CapacityState | None = None  # capacity control's memory (loop.capacity), when it owns replicas
    cooldown_until_s: float = 0.0
    metrics_available: bool = True
    slo_met: bool | None = None
    message: str = ""
    observed: Observed | None = None
    diagnosis: DiagnosisReport | None = None
    infeasible: InfeasibleReport | None = None

    @classmethod
    def initial(cls, config: RuntimeConfig) -> TuningState:
        return cls(phase=Phase.DEPLOYING, current=config, tried_keys=frozenset({config.key()}))

    def evolve(self, **changes: object) -> TuningState:
        return self.model_copy(update=changes)

    def record(self, entry: HistoryRecord) -> TuningState:
        return self.evolve(history=(*self.history, entry)[-MAX_HISTORY:])

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> TuningState:
        return cls.model_validate_json(text)

    def to_status(self) -> TunedModelStatus:
        """The user-facing status (without samples or bookkeeping)."""
        history = [HistoryEntry(iteration=h.iteration, time=h.time, knob=h.knob, change=h.change,
                                reason=(h.reason + (f" | {h.detail}" if h.detail else ""))[:4096], before=h.before,
                                after=h.after, config=h.config, verdict=h.verdict, verification=h.verification)
                   for h in self.history]
        pending = self.pending
        canary = (Canary(pod=pending.canary_pod, config=pending.config)
                  if pending is not None and pending.applied and pending.canary_pod else None)
        return TunedModelStatus(phase=self.phase, slo_met=self.slo_met, message=self.message[:4096],
                                iteration=self.iteration, observed=self.observed, diagnosis=self.diagnosis,
                                config=self.running, canary=canary, best_config=self.best, history=history,
                                capacity=_capacity_status(self.capacity))

    @property
    def at_rest(self) -> bool:
        """Nothing left to do until the workload changes: Infeasible or Degraded, or Converged with no cost-saving
        change left to try, and no change or rollout in flight."""
        done = self.phase in (Phase.INFEASIBLE, Phase.DEGRADED) or (self.phase is Phase.CONVERGED and self.settled)
        return done and self.pending is None and self.rollout is None

    @property
    def running(self) -> RuntimeConfig:
        """The config serving now: a change being verified runs before it is kept (`current` is what is kept), except
        during a canary, where the canary pod runs it and every other pod the previous config (the backend knows)."""
        if self.pending is not None and self.pending.applied and self.pending.canary_pod is None:
            return self.pending.config
        return self.current


def _capacity_status(capacity: CapacityState | None) -> CapacityStatus | None:
    if capacity is None or capacity.estimate is None:
        return None
    return CapacityStatus(ready=capacity.ready, starting=capacity.starting, arrival_rate=capacity.arrival_per_s,
                          forecast_rate=capacity.forecast_per_s, per_replica_rate=capacity.per_replica_per_s,
                          capacity_measured=capacity.estimate.measured, infeasible_at_rate=capacity.infeasible_at_rate,
                          message=capacity.message[:1024])


def now_utc() -> datetime:
    return datetime.now(UTC)


def observed(snapshot: MetricsSnapshot) -> Observed:
    return Observed.of(snapshot)
