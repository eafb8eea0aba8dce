"""What the loop reports and decides from the share of requests within each target (slo.attained).

The status shows, per target, the window's share within it, its exact lower confidence bound, and whether it was
counted exactly; where the evidence is a histogram with no edge at the target (vLLM's fixed buckets), the share
lies between the counts at the two edges of the bucket holding the target, and the diagnosis says so with both
numbers, since a percentile read there by interpolation cannot tell a target met from missed. A target missed by
attainment while its interpolated percentile sits under it is handed to the policy as a percentile that misses:
the target scaled down by percentile / quantile-at-the-required-share (slo_bound.tightened), so the policy sizes
the change to the real shortfall.
"""

from __future__ import annotations

from slotune.api.status import Observed, TargetAttainment
from slotune.judge.slo_bound import CONFIDENCE, TargetBound, share_lower_bound, tightened
from slotune.slo import SLOSpec, attained
from slotune.snapshot import LatencySummary, MetricsSnapshot


def observed(slo: SLOSpec, snapshot: MetricsSnapshot) -> Observed:
    """The window as the status shows it, with the share of requests within each target."""
    rows = []
    for t in slo.targets():
        found = attained(snapshot.latency(t.metric), t.target_ms, snapshot.num_failed_requests)
        if found is None or found.total <= 0:
            continue
        required = slo.required(t) or t.percentile / 100.0
        rows.append(TargetAttainment(
            target=t.name, target_ms=t.target_ms, required=required, attained=round(found.fraction, 4),
            lower_bound=round(share_lower_bound(round(found.within_low), round(found.total), CONFIDENCE), 4),
            exact=found.exact, low=None if found.exact else round(found.fraction_low, 4),
            high=None if found.exact else round(found.fraction_high, 4)))
    return Observed.of(snapshot).model_copy(update={"attainment": rows})


def interpolation_evidence(slo: SLOSpec, snapshot: MetricsSnapshot) -> tuple[str, ...]:
    """One line per target that falls inside a histogram bucket: the bounds its two edges put on the share."""
    lines = []
    for t in slo.targets():
        found = attained(snapshot.latency(t.metric), t.target_ms, snapshot.num_failed_requests)
        if found is None or found.exact or found.bucket_ms is None:
            continue
        low, high = found.bucket_ms
        lines.append(f"{t.name}: no bucket edge at {t.target_ms:g} ms (it falls in ({low:g}, {high:g}] ms): between "
                     f"{found.fraction_low:.1%} and {found.fraction_high:.1%} of requests are within it, "
                     f"{found.fraction:.1%} interpolated; the percentile there is an interpolation")
    return tuple(lines)


def as_percentiles(slo: SLOSpec, snapshot: MetricsSnapshot) -> SLOSpec:
    """The SLO with each target missed by attainment alone scaled so that the window's percentile misses it by as
    much as the quantile at the required share misses the target (see the module docstring)."""
    found = []
    for result in slo.evaluate(snapshot):
        t = result.target
        if result.required is None or result.met or result.observed_ms is None:
            continue
        quantile = _quantile_ms(snapshot.latency(t.metric), result.required)
        if quantile is not None and quantile > t.target_ms >= result.observed_ms:
            found.append(TargetBound(t, result.observed_ms, quantile))
    return tightened(slo, found) if found else slo


def _quantile_ms(summary: LatencySummary, share: float) -> float | None:
    if summary.samples_ms:
        ordered = sorted(summary.samples_ms)
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]
    if summary.histogram is None:
        return None
    value = summary.histogram.quantile_s(share)
    return None if value is None else value * 1000.0
