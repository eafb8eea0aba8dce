"""While the SLO is missed, a change is judged by the worst miss, not by which targets it newly breaks.

Before/after verification rolls a change back when another target gets worse beyond tolerance and misses
(`verification._regressions`). From a config that meets the SLO that is right: breaking a target is the one thing a
change must not do. From one that misses, it is not: the real SmolLM2 example's max_num_seqs 1 -> 8 and -> 16 were
rolled back as "breaks TPOT" (731-911 ms against 600) while TTFT, the target the change was for, fell from 23-99 s
to 14-19 s against 10 s: the worst normalised miss (observed / target, the largest over targets) fell from x2.3-9.9
to x1.5-1.9, and the config that was kept was further from the SLO. So a change whose targeted metric improved
beyond noise, from a baseline that misses, is kept when the worst miss shrank by more than TOLERANCE, whatever
target it newly breaks; the next change then works on that target. It cannot oscillate: every applied config is
excluded from later proposals (policy.admissible), the baseline among them, and this rule never applies once the
SLO holds. A throughput floor or failed requests still roll it back.

A baseline with no first token at all in its window (TTFT n/a: requests waited and none was served) is censored, not
unknown: whoever waited through it has a TTFT of at least the window. The real run compared "n/a -> 39,800 ms" and
rolled the change back as no improvement; a change whose TTFT is under the baseline's window length, with nothing
else worse, is kept.
"""

from __future__ import annotations

from dataclasses import replace

from slotune.judge.verification import TOLERANCE, Judgement
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, MetricsSnapshot


def worst_miss(slo: SLOSpec, snapshot: MetricsSnapshot) -> float:
    """The largest observed/target ratio over the latency targets (> 1: missed)."""
    return max((r.ratio for r in slo.evaluate(snapshot)), default=0.0)


def badness(slo: SLOSpec, snapshot: MetricsSnapshot) -> float:
    """The worst observed/target ratio of the window, the throughput floor included (<= 1 when every target holds):
    how the closest config so far is chosen, and how far a failed trim missed."""
    ratios = [r.ratio for r in slo.evaluate(snapshot)]
    if slo.min_throughput is not None:
        ratios.append(slo.min_throughput / max(snapshot.generation_tokens_per_s, 1e-9))
    return max(ratios, default=0.0)


def judged_by_worst_miss(verdict: Judgement, baseline: MetricsSnapshot, after: MetricsSnapshot,
                         slo: SLOSpec, target: LatencyMetric = LatencyMetric.TTFT,
                         percentile: int = 99) -> Judgement:
    """The verdict, or a kept one when only latency regressions rolled back a change that shrank the worst miss of
    a baseline that misses the SLO, or when the baseline's TTFT was censored (see the module docstring)."""
    censored = _censored(verdict, baseline, after, target, percentile)
    if censored is not None:
        return censored
    if verdict.keep or not verdict.regressions or not verdict.targeted.improved or slo.is_met(baseline):
        return verdict
    if not all("breaks its" in r for r in verdict.regressions):  # latency targets only: not throughput, failures
        return verdict
    before, now = worst_miss(slo, baseline), worst_miss(slo, after)
    if now * (1.0 + TOLERANCE) >= before:
        return verdict
    return replace(verdict, keep=True, reason=(
        f"the worst miss shrank x{before:.2f} -> x{now:.2f} of its target ({verdict.targeted.describe()}), though "
        f"{'; '.join(verdict.regressions)}"))


MIN_WAITING = 1.0  # requests waiting on average: below it, nobody need have waited through the whole window


def _censored(verdict: Judgement, baseline: MetricsSnapshot, after: MetricsSnapshot, target: LatencyMetric,
              percentile: int) -> Judgement | None:
    if verdict.keep or verdict.regressions or target is not LatencyMetric.TTFT:
        return None
    if baseline.ttft.at(percentile) is not None or (baseline.num_waiting_mean or 0.0) < MIN_WAITING:
        return None
    observed, at_least_ms = after.ttft.at(percentile), baseline.window_s * 1000.0
    if observed is None or observed >= at_least_ms:
        return None
    return replace(verdict, keep=True, reason=(
        f"the baseline served no first token in its {baseline.window_s:.0f} s window while "
        f"{baseline.num_waiting_mean:.1f} requests waited (TTFT >= {at_least_ms:,.0f} ms); now "
        f"ttft_p{percentile} {observed:,.0f} ms"))
