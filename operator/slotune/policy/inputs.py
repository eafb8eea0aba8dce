"""What the policy looks at (`PolicyInput`) and what it answers: a `Proposal`, an `Infeasible`, or, inside the
package, the candidate `Remedy` lists it picks from."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from slotune.api.tuning import Knob, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, MetricsSnapshot
from slotune.workload import WorkloadSpec

# KV cache usage above which a larger batch would preempt (recompute) rather than run: vLLM's block manager starts
# evicting near full, and a window's mean usage hides peaks above it.
KV_ROOM_USAGE = 0.85


def kv_room(snapshot: MetricsSnapshot) -> bool:
    """Whether the window left the KV cache room for more sequences."""
    return (snapshot.kv_cache_usage or 0.0) < KV_ROOM_USAGE


@dataclass(frozen=True)
class Proposal:
    config: RuntimeConfig
    knob: Knob
    change: str  # e.g. "max_num_seqs 4 -> 64"
    reason: str
    target_metric: LatencyMetric
    target_percentile: int
    trim: bool = False  # a cost-saving change made while the SLO holds: kept only if it still holds after


@dataclass(frozen=True)
class Infeasible:
    closest: RuntimeConfig
    reason: str
    needs: tuple[str, ...]
    best_effort: Proposal | None = None  # a change that still improves the targets in reach
    out_of_reach: tuple[str, ...] = ()  # targets below every allowed config's floor (best effort sets them aside)


@dataclass(frozen=True)
class PolicyInput:
    """Everything the policy may look at besides the diagnosis."""

    config: RuntimeConfig
    snapshot: MetricsSnapshot
    slo: SLOSpec
    tuning: TuningSpec
    deployment: Deployment
    excluded_keys: frozenset[str] = frozenset()
    rolled_back_moves: tuple[str, ...] = ()  # see move_key; a move is tried at most MAX_MOVE_ATTEMPTS times
    closest: RuntimeConfig | None = None
    workload: WorkloadSpec | None = None
    prepared_replicas: int | None = None  # a headroom change was just kept to make this replica count hold
    spec_acceptance: float | None = None  # per-token draft acceptance measured on this workload; None: never
    draft_model: str | None = None  # spec.model.draftModel: draft_model speculation only with one
    futile_moves: frozenset[str] = frozenset()  # measured not to move the windows that miss (sizing.move_direction)


def revisitable(kept: Iterable[RuntimeConfig], current: RuntimeConfig) -> frozenset[str]:
    """Kept configs a fix (not a trim) may return to: the current config with more replicas, which a kept trim shed,
    when the load needs them again; nothing else is revisited, so nothing flaps."""
    return frozenset(c.key() for c in kept if c.replicas > current.replicas
                     and c == current.with_changes(replicas=c.replicas))


class Remedy(NamedTuple):
    config: RuntimeConfig
    knob: Knob
    why: str
    target: LatencyMetric | None = None  # the metric it should improve, when not the worst violated one
    revisit: bool = False  # may return to a config tried before (speculation off after acceptance made it a loss)
