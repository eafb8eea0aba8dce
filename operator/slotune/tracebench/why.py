"""Where slotune's GPU-hours go when the goal check finds them short, measured from the replays: the replicas it
ran on average in the second pass against the cheapest baseline as good, and the per-replica capacity it planned
with at the end against what the profiler measures for the engine configs. A plan that sizes each replica at a
fraction of its profiled capacity runs that many more replicas; the line says which it was."""

from __future__ import annotations

from slotune.tracebench.goal import GoalCheck
from slotune.tracebench.replay import Replayed
from slotune.tracebench.run import CaseResult


def mean_replicas(run: Replayed, index: int) -> float:
    """Replicas ordered (serving or starting) on average over the windows of pass `index`."""
    begin_s, end_s = index * run.pass_s, (index + 1) * run.pass_s
    windows = [w for w in run.windows if begin_s < w.end_s <= end_s + 1e-9]
    return sum(w.num_ready + w.num_starting for w in windows) / len(windows) if windows else 0.0


def shortfall(result: CaseResult, checked: GoalCheck) -> str:
    """One line on why slotune's cost is short of the goal; empty when it is not."""
    short = [c for c in checked.costs if not c.met and c.reference is not None]
    ours = next((r for r in result.runs if r.strategy == "slotune"), None)
    if not short or ours is None:
        return ""
    parts = [f"slotune ran {mean_replicas(ours, 1):.1f} replicas on average in pass 2"]
    for cost in short:
        assert cost.reference is not None
        ref = next(r for r in result.runs if (r.strategy, r.engine_config, r.variant) ==
                   (cost.reference.strategy, cost.reference.engine_config, cost.reference.variant))
        parts.append(f"{ref.strategy} ({ref.engine_config}) {mean_replicas(ref, 1):.1f}")
    profiled = ", ".join(f"{k} {v:.2f}" for k, v in result.capacity_per_replica.items())
    note = f"; at the end it planned with {ours.capacity_note}" if ours.capacity_note else ""
    return (f"Why short, measured: {', '.join(parts)}{note}; the profiler measures {profiled} req/s per replica "
            f"for the engine configs (final config `{ours.final_config}`).")
