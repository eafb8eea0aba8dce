"""The tuning state machine's memory: one frozen, JSON-serialisable `TuningState` per tuned deployment.

Everything the loop needs to resume after a restart lives here: the phase, the config running and the best one, the
window every change is compared against (with its samples, for confidence intervals), the change awaiting
verification, configs never to try again, the convergence counter and the cooldown deadline. The operator keeps it
next to the resource's status, local mode in a file; `to_status` renders the user-facing `TunedModelStatus`. Grouped
by concern: what runs and is pending (the top level, `PendingChange`), what was measured (`Measured`), what was
learned (`Learned`), how the config converges (`Convergence`). Files saved before the grouping (flat fields, the
proposal spelled out on the pending change) still load (tests/unit/loop/test_state_compat.py).
"""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

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
from slotune.policy import Proposal
from slotune.policy.capacity import CapacityState
from slotune.policy.futile import LuckyKeep
from slotune.snapshot import MetricsSnapshot


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")


class PendingChange(_Frozen):
    """A change decided on: the policy's proposal, the config it replaces, and how its verification stands.
    `applied` is False between deciding and the backend confirming it (crash-safe intent)."""

    proposal: Proposal  # what was decided: config, knob, change, reason, the metric it targets, trim or fix
    previous: RuntimeConfig
    applied: bool = False
    canary_pod: str | None = None  # verified as a canary: this pod runs `config`, its siblings `previous`
    canary_pool: CanaryPool | None = None  # the canary's inconclusive windows so far, both arms pooled
    canary_endpoint: str | None = None  # the canary pod's OpenAI endpoint: the quality gate probes it alone
    drain_windows: int = 0  # windows not judged while a capacity increase drained the old backlog (loop.drain)
    drain_backlog: float | None = None  # the last such window's mean waiting requests, all replicas
    rebaseline: bool = False  # the machine's speed drifted: the previous config serves a fresh baseline window first
    rebaselined: bool = False  # measured against a fresh baseline once already (loop.rebaseline)
    fixes_miss: bool = False  # made for a window that missed the SLO: not needed if the fresh baseline meets it

    @model_validator(mode="before")
    @classmethod
    def _proposal_of_old_files(cls, data: Any) -> Any:
        """A state saved before issue 31 spelled the proposal's fields out on the pending change."""
        if isinstance(data, dict) and "proposal" not in data and "config" in data:
            data = dict(data)
            data["proposal"] = {name: data.pop(name) for name in _PROPOSAL_FIELDS if name in data}
        return data

    @property
    def config(self) -> RuntimeConfig:
        """The candidate config (the proposal's)."""
        return self.proposal.config

    @property
    def change(self) -> str:
        """The change, described (the proposal's: "max_num_seqs 4 -> 64")."""
        return self.proposal.change


_PROPOSAL_FIELDS = tuple(f.name for f in fields(Proposal))


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


class Measured(_Frozen):
    """What was measured: the windows the loop holds on to, and the last judged window's report."""

    baseline: MetricsSnapshot | None = None  # the window the pending change is compared against
    first_after: MetricsSnapshot | None = None  # an inconclusive first window of the pending change (pooled next)
    short: MetricsSnapshot | None = None  # windows under minSamples so far, pooled until they reach it
    short_of: str = ""  # the config (described) that served `short`
    streak: tuple[MetricsSnapshot, ...] = ()  # the latest windows of the current config's met streak (slo_bound)
    streak_of: str = ""  # the config (described) whose windows `streak` holds
    metrics_available: bool = True
    slo_met: bool | None = None
    observed: Observed | None = None


class Learned(_Frozen):
    """What was learned about this deployment and workload: configs and moves not to try again, the closest config so
    far, and the calibrations later windows are judged with. A re-open (a spec change, a workload shift) forgets the
    search, not the calibrations."""

    failed_keys: frozenset[str] = frozenset()  # crashed or never ready: never again
    tried_keys: frozenset[str] = frozenset()  # applied before (kept or rolled back): not revisited
    rolled_back_moves: tuple[str, ...] = ()  # knob settings that did not help, once per rollback (policy.move_key)
    futile_moves: tuple[str, ...] = ()  # at every allowed replica, knob moves that did not move the windows that miss
    lucky: LuckyKeep | None = None  # the last change, kept on a met window alone: re-judged on its next miss
    best: RuntimeConfig | None = None
    best_badness: float | None = None  # worst observed/target ratio of the best config's window (<= 1: met)
    prepared_replicas: int | None = None  # a headroom change was made so this replica count can hold: try it next
    speed_ratios: tuple[float, ...] = ()  # recent windows' measured / profiled step time (perfmodel.window_step)
    spec_acceptance: float | None = None  # per-token draft acceptance measured on this workload (None: never)
    noise_floor: NoiseFloor | None = None  # the pods' A/A spread, from windows without a canary (canary_noise)


class Convergence(_Frozen):
    """How the current config stands toward rest: its met and missed windows, and what it came to rest on."""

    windows_met: int = 0
    windows_missed: int = 0  # consecutive violations after convergence (hysteresis before retuning)
    forgiven_of: str = ""  # the config (described) whose one missed window while confirming was measured again
    settled: bool = False  # converged with no cost-saving change left to try
    load_reference: tuple[WindowLoad, ...] = ()  # the load of the windows since it came to rest (loop.shift)
    load_held: tuple[WindowLoad, ...] = ()  # windows since, whose rate moved without a test to show it (loop.shift)
    spec_key: str = ""  # the SLO and tuning it came to rest under: a spec change re-opens Infeasible and Degraded
    reopens: int = 0  # times Infeasible re-opened at this load because the SLO held again (loop.reopen: backoff)


_RECORDS: dict[str, type[_Frozen]] = {"measured": Measured, "learned": Learned, "convergence": Convergence}
# Each record's field -> the record: `evolve` and the files written before the records existed name fields flat.
_OWNER = {name: record for record, model in _RECORDS.items() for name in model.model_fields}


class TuningState(_Frozen):
    """Where the state machine is (phase, the config kept and the one rolling out, the change pending, the history
    and what it says now), and one record per concern: what was measured, what was learned, how it converges.
    A controller beside the configuration search (capacity) adds its own record as one field."""

    phase: Phase = Phase.PENDING
    iteration: int = 0  # windows judged
    changes_applied: int = 0
    current: RuntimeConfig
    rollout: RuntimeConfig | None = None  # asked of the backend (first deploy, rollback), not serving yet
    pending: PendingChange | None = None
    cooldown_until_s: float = 0.0
    history: tuple[HistoryRecord, ...] = ()
    message: str = ""
    diagnosis: DiagnosisReport | None = None
    infeasible: InfeasibleReport | None = None
    measured: Measured = Measured()
    learned: Learned = Learned()
    convergence: Convergence = Convergence()
    capacity: CapacityState | None = None  # capacity control's memory (loop.capacity), when it owns replicas

    @model_validator(mode="before")
    @classmethod
    def _records_of_flat_fields(cls, data: Any) -> Any:
        """Fields named flat (a state saved before issue 31, or a test building one) go to their record."""
        if not isinstance(data, dict) or not _OWNER.keys() & data.keys():
            return data
        data = dict(data)
        for name in _OWNER.keys() & data.keys():
            record = data.setdefault(_OWNER[name], {})
            record = data[_OWNER[name]] = record.model_dump() if isinstance(record, BaseModel) else dict(record)
            record[name] = data.pop(name)
        return data

    @classmethod
    def initial(cls, config: RuntimeConfig) -> TuningState:
        return cls(phase=Phase.DEPLOYING, current=config, tried_keys=frozenset({config.key()}))

    def evolve(self, **changes: object) -> TuningState:
        """A copy with `changes`; a record's fields are named flat (`windows_met=0`) and land in their record."""
        top = {name: value for name, value in changes.items() if name not in _OWNER}
        for record in {_OWNER[name] for name in changes if name in _OWNER}:
            update = {name: value for name, value in changes.items() if _OWNER.get(name) == record}
            top[record] = getattr(self, record).model_copy(update=update)
        return self.model_copy(update=top)

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
        return TunedModelStatus(phase=self.phase, slo_met=self.measured.slo_met, message=self.message[:4096],
                                iteration=self.iteration, observed=self.measured.observed, diagnosis=self.diagnosis,
                                config=self.running, canary=canary, best_config=self.learned.best, history=history,
                                capacity=_capacity_status(self.capacity))

    @property
    def at_rest(self) -> bool:
        """Nothing left to do until the workload changes: Infeasible or Degraded, or Converged with no cost-saving
        change left to try, and no change or rollout in flight."""
        settled = self.phase is Phase.CONVERGED and self.convergence.settled
        done = self.phase in (Phase.INFEASIBLE, Phase.DEGRADED) or settled
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
