"""Capacity control's place in the loop: every window, before the configuration search, the replicas the load needs.

The loop reads one window and hands it here first, whatever else is in flight (a change being verified, a rollout,
rest). What the window carried (arrivals, served requests, the queue, the replicas that served and those still
starting) becomes a `CapacityWindow`; `policy.capacity.plan` answers how many replicas to run; an answer that
differs is ordered from the backend at once, without waiting for the new replicas, and recorded in the history as
a capacity step. The configuration search then runs only on a window that was `steady` (nothing starting, no
step ordered within it or at its end): any other window measured the load's motion, not a config.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slotune.api.status import Observed, Verdict
from slotune.api.tuning import Knob, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop.measure import MeasureStep
from slotune.loop.protocols import ReplicaCounts, replica_counts
from slotune.loop.state import HistoryRecord, TuningState, now_utc
from slotune.perfmodel import capacity as model
from slotune.perfmodel.deployment import Deployment
from slotune.policy.capacity import (
    CapacityPlan,
    CapacitySettings,
    CapacityState,
    CapacityWindow,
    owns_replicas,
    plan,
)
from slotune.slo import SLOSpec
from slotune.snapshot import MetricsSnapshot

CPU_STARTUP_PRIOR_S = 15.0  # a local runtime process: load a small model, no image to pull
GPU_STARTUP_PRIOR_S = 120.0  # a GPU pod: schedule, pull, load weights, warm up


@dataclass(frozen=True)
class CapacityStep:
    """What capacity control did with one window, for the loop to act on and report."""

    plan: CapacityPlan
    counts: ReplicaCounts
    waits: str = ""  # why the configuration search may not judge this window; empty: it may (the window is steady)

    @property
    def steady(self) -> bool:
        return not self.waits


def settings_for(tuning: TuningSpec, initial: RuntimeConfig, deployment: Deployment) -> CapacitySettings:
    most = tuning.bounds.max_replicas if tuning.bounds.max_replicas is not None else initial.replicas
    cpu = deployment.accelerator.name == "cpu"
    return CapacitySettings(min_replicas=tuning.bounds.min_replicas, max_replicas=most,
                            startup_prior_s=CPU_STARTUP_PRIOR_S if cpu else GPU_STARTUP_PRIOR_S)


def prior_per_replica(deployment: Deployment, config: RuntimeConfig, snapshot: MetricsSnapshot,
                      slo: SLOSpec) -> float:
    """The performance model's SLO-meeting requests/s for one replica at this window's request lengths."""
    load = model.Load(snapshot.request_rate_per_s, snapshot.mean_prompt_tokens or 1.0,
                      snapshot.mean_generation_tokens or 1.0)
    tpot = None if slo.tpot is None else min(v for v in (slo.tpot.p50, slo.tpot.p95, slo.tpot.p99) if v)
    one = config.with_changes(replicas=1)
    return model.TARGET_UTILIZATION / max(model.service_s(deployment, one, load, tpot), 1e-9)


def window_of(snapshot: MetricsSnapshot, counts: ReplicaCounts, end_s: float, met: bool,
              prior: float) -> CapacityWindow:
    """A window in capacity control's terms: per-replica gauges times the replicas that served them."""
    ready = max(counts.ready, 1)
    waiting_mean = (snapshot.num_waiting_mean or 0.0) * ready
    end = snapshot.num_waiting_end if snapshot.num_waiting_end is not None else snapshot.num_waiting_mean
    arrivals = snapshot.arrival_rate_per_s if snapshot.arrival_rate_per_s is not None else snapshot.request_rate_per_s
    return CapacityWindow(end_s=end_s, window_s=snapshot.window_s, arrival_rate_per_s=max(arrivals, 0.0),
                          served_rate_per_s=max(snapshot.request_rate_per_s, 0.0), waiting_end=(end or 0.0) * ready,
                          waiting_mean=waiting_mean, ready=counts.ready, starting=counts.starting, met=met,
                          prior_per_replica=prior)


def control(state: CapacityState | None, snapshot: MetricsSnapshot, counts: ReplicaCounts, config: RuntimeConfig,
            deployment: Deployment, slo: SLOSpec, settings: CapacitySettings, end_s: float,
            may_trim: bool = True) -> CapacityStep:
    """One window of capacity control for the deployment running `config`."""
    state = _measure_startup(state or CapacityState(ordered=config.replicas), counts, end_s)
    counts = _served_through(state, counts, end_s)
    prior = prior_per_replica(deployment, config, snapshot, slo)
    window = window_of(snapshot, counts, end_s, slo.is_met(snapshot), prior)
    decided = plan(state, window, _config_key(config), settings, may_trim)
    # The search judges a config only on a window that measured it: nothing starting, no step within the window,
    # and no queue in it or the window before (the first window after a queue drains still serves the requests
    # that waited in it): those windows measured the load's motion, not the config. That holds at maxReplicas too:
    # before/after under a growing queue measures the queue; the search improves a replica on the calm windows.
    last = state.last_step
    queued = max(window.waiting_end, window.waiting_mean) >= max(counts.ready, 1)
    queued_before = state.queued_at_s is not None and end_s - state.queued_at_s <= window.window_s * 1.5
    if queued:
        decided = replace(decided, state=decided.state.model_copy(update={"queued_at_s": end_s}))
    if counts.starting:
        waits = f"{counts.starting} replica(s) starting"
    elif decided.changed(config.replicas):
        waits = "replicas change now"
    elif last is not None and end_s - last.at_s < window.window_s:
        waits = "the window served part of the time at another replica count"
    elif queued or queued_before:
        waits = "requests queued: the window measured the load's motion, not the config"
    else:
        waits = ""
    return CapacityStep(decided, counts, waits)


def _config_key(config: RuntimeConfig) -> str:
    """The engine config whose capacity is learned: replicas aside, as capacity is per replica."""
    return config.with_changes(replicas=1).key()


def _served_through(state: CapacityState, counts: ReplicaCounts, end_s: float) -> ReplicaCounts:
    """The replicas as the window saw them: ones first seen serving at its end started within it, so they count as
    starting (the backend's counts are the window's end; a window half-served by them measures neither count)."""
    step = state.last_step
    if step is None or not step.up or step.served_at_s != end_s:
        return counts
    ready = min(counts.ready, step.from_replicas)
    return ReplicaCounts(ready=ready, starting=counts.ready + counts.starting - ready)


def _measure_startup(state: CapacityState, counts: ReplicaCounts, now_s: float) -> CapacityState:
    step = state.last_step
    if step is None or not step.up or step.served_at_s is not None or counts.ready < step.to_replicas:
        return state
    served = step.model_copy(update={"served_at_s": now_s})
    return state.with_startup(now_s - step.at_s).model_copy(update={"last_step": served})


class CapacityControlStep(MeasureStep):
    """The loop's capacity step (see the module docstring); every window passes here before the search sees it."""

    def _capacity_on(self) -> bool:
        return owns_replicas(self.problem.tuning, self.problem.initial)

    def _control_capacity(self, state: TuningState, snapshot: MetricsSnapshot) -> tuple[TuningState, bool]:
        """Capacity control for this window. Returns the state and whether the configuration search may judge it."""
        if not self._capacity_on():
            return state, True
        settings = settings_for(self.problem.tuning, self.problem.initial, self.problem.deployment)
        counts = replica_counts(self.backend, state.running)
        step = control(state.capacity, snapshot, counts, state.running, self._deployment(state), self.problem.slo,
                       settings, self.clock(), may_trim=state.pending is None)
        state = _judged(state.evolve(capacity=step.plan.state), step.plan.verdict)
        if step.plan.changed(state.running.replicas):
            return self._scaled(state, step.plan, snapshot), False
        if not step.steady:
            return state.evolve(message=f"configuration search waits ({step.waits}): {step.plan.reason}"), False
        return state, True

    def _scaled(self, state: TuningState, decided: CapacityPlan, snapshot: MetricsSnapshot) -> TuningState:
        """Order the plan's replicas without waiting for them. A change under before/after verification loses its
        baseline (another replica count served it): it goes back to an intent, measured afresh once steady."""
        before = state.running.replicas
        state = with_replicas(_interrupted(state), decided.replicas)
        result = self.backend.apply(state.running)
        change = f"replicas {before} -> {decided.replicas}"
        if not result.ok and not result.in_progress:
            reverted = with_replicas(state, before)
            assert reverted.capacity is not None
            return reverted.evolve(capacity=reverted.capacity.model_copy(update={"ordered": before}),
                                   message=f"capacity: {change} failed ({result.reason}); keeping {before}")
        entry = HistoryRecord(iteration=state.iteration, time=now_utc(), knob=Knob.REPLICAS, change=change,
                              reason=decided.reason, after=Observed.of(snapshot), config=state.running,
                              verdict=Verdict.SCALED)
        return state.record(entry).evolve(message=f"capacity: {change}: {decided.reason}")


def with_replicas(state: TuningState, replicas: int) -> TuningState:
    """Every config the state names, at `replicas`: capacity control owns the count, the search the engine knobs."""
    def at(config: RuntimeConfig | None) -> RuntimeConfig | None:
        return None if config is None else config.with_changes(replicas=replicas)

    pending = state.pending
    if pending is not None:
        # The candidate lives in the proposal (PendingChange.config reads it from there).
        pending = pending.model_copy(update={"proposal": replace(pending.proposal, config=at(pending.config)),
                                             "previous": at(pending.previous)})
    infeasible = state.infeasible
    if infeasible is not None:
        infeasible = infeasible.model_copy(update={"closest": at(infeasible.closest)})
    return state.evolve(current=at(state.current), best=at(state.learned.best), pending=pending, infeasible=infeasible,
                        rollout=at(state.rollout))


def _interrupted(state: TuningState) -> TuningState:
    """A change verified before/after, applied: its baseline no longer describes what it is compared with. It is
    taken back to an intent with a fresh baseline to come (the rebaseline path); a canary compares its arms within
    one window and goes on."""
    pending = state.pending
    if pending is None or not pending.applied or pending.canary_pod is not None:
        return state
    again = pending.model_copy(update={"applied": False, "rebaseline": True})
    return state.evolve(pending=again, baseline=None, first_after=None,
                        changes_applied=max(state.changes_applied - 1, 0))


def _judged(state: TuningState, verdict: str | None) -> TuningState:
    """The last capacity step's verdict joins its history entry (the status keeps it)."""
    if verdict is None:
        return state
    for i in range(len(state.history) - 1, -1, -1):
        entry = state.history[i]
        if entry.verdict is Verdict.SCALED:
            detail = f"{entry.detail}; {verdict}" if entry.detail else verdict
            history = (*state.history[:i], entry.model_copy(update={"detail": detail}), *state.history[i + 1:])
            return state.evolve(history=history)
    return state
