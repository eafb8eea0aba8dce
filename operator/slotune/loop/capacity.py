"""Capacity control's place in the loop: every window, before the configuration search, the replicas the load needs.

The loop reads one window and hands it here first, whatever else is in flight (a change being verified, a rollout,
rest). What the window carried (arrivals, served requests, the queue, the replicas that served and those still
starting) becomes a `CapacityWindow`; `policy.capacity.plan` answers how many replicas to run; an answer that
differs is ordered from the backend at once, without waiting for the new replicas, and recorded in the history as
a capacity step. The configuration search then runs only on a window that was `steady` (nothing starting, no
queue standing, no step ordered at its end): any other window measured the load's motion, not a config.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotune.api.tuning import Knob, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop.protocols import Backend, ReplicaCounts
from slotune.perfmodel import capacity as model
from slotune.perfmodel.deployment import Deployment
from slotune.policy.capacity import CapacityPlan, CapacitySettings, CapacityState, CapacityWindow, plan
from slotune.slo import SLOSpec
from slotune.snapshot import MetricsSnapshot

CPU_STARTUP_PRIOR_S = 15.0  # a local runtime process: load a small model, no image to pull
GPU_STARTUP_PRIOR_S = 120.0  # a GPU pod: schedule, pull, load weights, warm up
STANDING_QUEUE = 1.0  # requests waiting per ready replica at a window's end above which the queue stands


@dataclass(frozen=True)
class CapacityStep:
    """What capacity control did with one window, for the loop to act on and report."""

    plan: CapacityPlan
    counts: ReplicaCounts
    steady: bool  # the configuration search may judge this window


def active(tuning: TuningSpec, initial: RuntimeConfig) -> bool:
    """Capacity control owns replicas when the tuner may change them and the bounds leave it room."""
    most = tuning.bounds.max_replicas if tuning.bounds.max_replicas is not None else initial.replicas
    return Knob.REPLICAS in tuning.knobs and most > tuning.bounds.min_replicas


def settings_for(tuning: TuningSpec, initial: RuntimeConfig, deployment: Deployment) -> CapacitySettings:
    most = tuning.bounds.max_replicas if tuning.bounds.max_replicas is not None else initial.replicas
    cpu = deployment.accelerator.name == "cpu"
    return CapacitySettings(min_replicas=tuning.bounds.min_replicas, max_replicas=most,
                            startup_prior_s=CPU_STARTUP_PRIOR_S if cpu else GPU_STARTUP_PRIOR_S)


def replica_counts(backend: Backend, running: RuntimeConfig) -> ReplicaCounts:
    """Ready and starting replicas, from a backend that tells them; else every replica of the config serves."""
    reader = getattr(backend, "replica_counts", None)
    return reader() if reader is not None else ReplicaCounts(ready=running.replicas, starting=0)


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
            deployment: Deployment, slo: SLOSpec, settings: CapacitySettings, end_s: float) -> CapacityStep:
    """One window of capacity control for the deployment running `config`."""
    state = _measure_startup(state or CapacityState(ordered=config.replicas), counts, end_s)
    prior = prior_per_replica(deployment, config, snapshot, slo)
    window = window_of(snapshot, counts, end_s, slo.is_met(snapshot), prior)
    decided = plan(state, window, _config_key(config), settings)
    steady = (counts.starting == 0 and window.waiting_end < STANDING_QUEUE * max(counts.ready, 1)
              and not decided.changed(config.replicas))
    return CapacityStep(decided, counts, steady)


def _config_key(config: RuntimeConfig) -> str:
    """The engine config whose capacity is learned: replicas aside, as capacity is per replica."""
    return config.with_changes(replicas=1).key()


def _measure_startup(state: CapacityState, counts: ReplicaCounts, now_s: float) -> CapacityState:
    step = state.last_step
    if step is None or not step.up or step.served_at_s is not None or counts.ready < step.to_replicas:
        return state
    served = step.model_copy(update={"served_at_s": now_s})
    return state.with_startup(now_s - step.at_s).model_copy(update={"last_step": served})
