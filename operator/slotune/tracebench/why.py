"""Where slotune's GPU-hours go when the goal check finds them short, measured from the replays: the replicas it
ran on average in the second pass against the cheapest baseline as good, each with the attainment it bought (the
goal asks slotune for every baseline's, and compares its cost with baselines that reach 99%), and the per-replica
capacity it planned with at the end against what the profiler measures for the engine configs. A plan that sizes
each replica at a fraction of its profiled capacity runs that many more replicas; the line says which it was, and
splits the excess: the replicas each window's measured arrivals needed at the capacity slotune planned with (what
ran beyond them was ordered ahead of the load: the forecast's upper band a start-up ahead, the trims' hysteresis),
and at the oracle config's profiled capacity (the difference is the capacity the plan did not count on, or, below zero,
what it counted on beyond one replica's: a fleet multiplexes bursts)."""

from __future__ import annotations

import math

from slotune.tracebench.goal import GoalCheck, required_attainment
from slotune.tracebench.replay import Replayed
from slotune.tracebench.run import CaseResult


def mean_replicas(run: Replayed, index: int) -> float:
    """Replicas ordered (serving or starting) on average over the windows of pass `index`."""
    begin_s, end_s = index * run.pass_s, (index + 1) * run.pass_s
    windows = [w for w in run.windows if begin_s < w.end_s <= end_s + 1e-9]
    return sum(w.num_ready + w.num_starting for w in windows) / len(windows) if windows else 0.0


def needed_replicas(run: Replayed, index: int, per_replica: list[float]) -> float:
    """Replicas the measured arrivals of each window of pass `index` needed at `per_replica` requests/s each (the
    window's own entry; 0: unknown, the window is left out), on average."""
    begin_s, end_s = index * run.pass_s, (index + 1) * run.pass_s
    counts = [max(math.ceil(w.arrival_rate_per_s / cap - 1e-9), 1)
              for w, cap in zip(run.windows, per_replica, strict=True)
              if begin_s < w.end_s <= end_s + 1e-9 and cap > 0]
    return sum(counts) / len(counts) if counts else 0.0


def _split(ours: Replayed, profiled_per_s: float) -> str:
    """What each window's arrivals needed at the planned and at the profiled capacity, against what ran."""
    if len(ours.planned_per_replica) != len(ours.windows) or profiled_per_s <= 0:
        return ""
    ran = mean_replicas(ours, 1)
    planned = needed_replicas(ours, 1, ours.planned_per_replica)  # same length as the windows, checked above
    profiled = needed_replicas(ours, 1, [profiled_per_s] * len(ours.windows))
    if planned <= 0:
        return ""
    under = planned - profiled
    capacity = (f"{under:+.1f} for planning under the profiled capacity" if under >= 0 else
                f"{under:+.1f} for planning above it (replicas behind one router take each other's bursts, which "
                "one replica alone, as profiled, cannot)")
    return (f"; each pass-2 window's measured arrivals needed {planned:.1f} replicas on average at the capacity "
            f"slotune planned with and {profiled:.1f} at the oracle config's profiled {profiled_per_s:.2f} req/s: "
            f"{ran - planned:+.1f} replicas ran ahead of the measured load (the forecast's upper band a start-up "
            f"ahead, trim hysteresis), {capacity}")


def shortfall(result: CaseResult, checked: GoalCheck) -> str:
    """One line on why slotune's cost is short of the goal; empty when it is not."""
    short = [c for c in checked.costs if not c.met and c.reference is not None]
    ours = next((r for r in result.runs if r.strategy == "slotune"), None)
    if not short or ours is None:
        return ""
    asked = required_attainment(result.figures)
    parts = [f"slotune ran {mean_replicas(ours, 1):.1f} replicas on average in pass 2 for {checked.attainment:.2%} "
             f"of requests (the goal asks {asked:.2%}, at least every baseline's)"]
    for cost in short:
        assert cost.reference is not None
        ref = next(r for r in result.runs if (r.strategy, r.engine_config, r.variant) ==
                   (cost.reference.strategy, cost.reference.engine_config, cost.reference.variant))
        parts.append(f"{ref.strategy} ({ref.engine_config}) {mean_replicas(ref, 1):.1f} for "
                     f"{cost.reference.second.attainment:.2%}")
    profiled = ", ".join(f"{k} {v:.2f}" for k, v in result.capacity_per_replica.items())
    note = f"; at the end it planned with {ours.capacity_note}" if ours.capacity_note else ""
    split = _split(ours, result.capacity_per_replica.get("oracle", 0.0))
    return (f"Why short, measured: {', '.join(parts)}{note}; the profiler measures {profiled} req/s per replica "
            f"for the engine configs (final config `{ours.final_config}`){split}.")
