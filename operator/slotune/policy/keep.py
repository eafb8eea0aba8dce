"""Keep or roll back: the judge's verdict on a change (slotune.judge), with the policy's amendments.

Before/after, from a baseline that misses, a change is judged by the worst miss (`worst_miss`). A change that can
alter outputs is kept only if the quality gate holds as well. A trim is kept only if the SLO still holds, over as
many windows as convergence needs. A verdict that one more window could turn (inconclusive: the targeted metric moved
the right way, nothing got worse) waits for that window, pooled, unless the window already measured the squeeze at
the roomiest config. The loop applies the answer (`loop.verify`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from slotune.judge.verification import Judgement
from slotune.policy.worst_miss import judged_by_worst_miss
from slotune.quality.gate import QualityVerdict
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, MetricsSnapshot

LOAD_APART = 1.5  # arrival rates this many times apart: a before/after comparison measures the load


@dataclass(frozen=True)
class OneMoreWindow:
    """No verdict yet: the window is kept and pooled with the next one; `reason` says why."""

    reason: str


@dataclass(frozen=True)
class Judged:
    """The change as it was judged: what it targeted, how, and against what."""

    baseline: MetricsSnapshot
    after: MetricsSnapshot
    judged: SLOSpec  # the SLO judged (best effort: the targets still in reach)
    target_metric: LatencyMetric
    target_percentile: int
    trim: bool
    canary: bool
    first_after: MetricsSnapshot | None  # the change's earlier window, when this is its second
    added_replicas: bool = False  # replicas raised and nothing else: a capacity step


def with_quality(verdict: Judgement, quality: QualityVerdict | None) -> Judgement:
    """A change that can alter outputs is kept only if the quality gate holds as well; one that breaks it is rolled
    back at once (a quality regression, never inconclusive), its numbers in the history."""
    if quality is None:
        return verdict
    if not quality.keep:
        reason = quality.reason if verdict.keep else f"{quality.reason}; {verdict.reason}"
        return replace(verdict, keep=False, reason=reason, regressions=(*verdict.regressions, "quality"))
    return replace(verdict, reason=f"{verdict.reason}; {quality.reason}")


def amended(verdict: Judgement, change: Judged, quality: QualityVerdict | None, slo: SLOSpec,
            convergence_windows: int, squeezed: Callable[[], bool]) -> Judgement | OneMoreWindow:
    """The verdict to act on, or one more window first. `slo`: the declared SLO (a trim must keep all of it);
    `squeezed`: whether this window measured the squeeze at the roomiest config (policy.squeeze_verdict), asked only
    when it matters."""
    if not change.canary and not change.trim:
        verdict = judged_by_worst_miss(verdict, change.baseline, change.after, change.judged, change.target_metric,
                                       change.target_percentile)
    verdict = with_quality(verdict, quality)
    if change.added_replicas and not verdict.keep and not change.canary and not slo.is_met(change.baseline):
        capacity = _capacity_step(verdict, change)
        if capacity is not None:
            return capacity
    if change.trim:
        met = slo.is_met(change.after)
        if met and change.first_after is None and convergence_windows > 1:
            # A saving is kept only if the SLO holds over consecutive windows, as convergence itself requires:
            # one window that happens to be kind must not shed a replica the next burst needs.
            return OneMoreWindow("SLO holds; confirming over one more window")
        return replace(verdict, keep=met, reason="SLO still holds" if met else f"SLO broken: {verdict.reason}")
    if verdict.inconclusive and change.first_after is None and not change.canary and not squeezed():
        # One window of a tail percentile is a noisy estimate: a change that moved it the right way, and made
        # nothing worse, earns one more window before the verdict (both windows pooled); not one that already
        # measured the squeeze at the roomiest config (policy.squeeze_verdict), whichever way it moved.
        return OneMoreWindow(f"{verdict.reason}; measuring one more window before deciding")
    return verdict


def _loads_apart(baseline: MetricsSnapshot, after: MetricsSnapshot) -> float | None:
    """How many times apart the two windows' arrival rates are (>= 1); None where either is unknown."""
    rates = [w.request_rate_per_s for w in (baseline, after)]
    if any(r is None or not r > 0 for r in rates):
        return None
    high, low = max(rates), min(rates)  # type: ignore[type-var]
    return high / low


def _capacity_step(verdict: Judgement, change: Judged) -> Judgement | OneMoreWindow | None:
    """A replica added while the SLO missed, judged on windows whose loads were LOAD_APART or more apart: their
    percentiles measure the load, not the step (one more replica cannot slow a request at the same load). One more
    window first; then the step is kept, and trims take it back once the SLO holds without it. Not a replica added
    for margin (the SLO held): that must show its gain. In the tuner benchmark's bursty code worlds (arrival CV 13:
    one window's rate 0.8/s, the next's 9/s), replicas that narrowed the miss noise-free on the same traffic were
    rolled back; with this rule false rollbacks fell from 19 to 12. None: the loads compare, judge as usual."""
    apart = _loads_apart(change.baseline, change.after)
    if apart is None or apart < LOAD_APART:
        return None
    why = f"the windows carried loads x{apart:.1f} apart, so their latencies judge the load, not the added replica"
    if change.first_after is None:
        return OneMoreWindow(f"{verdict.reason}; {why}: measuring one more window before deciding")
    return replace(verdict, keep=True, reason=f"{why}: kept as capacity (a trim takes it back if the SLO holds "
                                             f"without it); {verdict.reason}")
