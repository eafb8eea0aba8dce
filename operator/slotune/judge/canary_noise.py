"""The pods' own A/A spread: how far apart two pods of one config measure in one window, so a canary is called
better or worse only beyond it.

slotune.judge.canary's exact test treats a window's requests as exchangeable between the arms: any difference beyond the
sampling noise is the config's. Pods are not interchangeable in that way: two processes of one config on shared
cores measured 1.2-1.5x apart in median in one window (a stall of one process, a noisy neighbour), so under A/A the
test called the canary worse in 10% of windows against its nominal 5% (bench/results/canary.*, stop 23). Every
window in which all pods run one config is an A/A observation of that spread: the first pod by name (where a live
canary goes) against the others pooled, the log of their ratio at each SLO percentile and at each metric's median.

The floor at one-sided level a, for one percentile: with n such log ratios r_i (A/A: centred on 0 by design; their
root mean square s, taken about 0 so a steady offset between pods widens it too), a new A/A window's log ratio lies
beyond t(1 - a, n) * s with probability about a (a prediction bound for a normal draw whose scale is estimated from n
draws). The canary rule then needs both: its exact test at a, and a ratio beyond exp(t * s) in the same direction.
Under A/A either alone errs at about a, both together at most that, whether or not the pods are exchangeable. The
floor's observations include the sampling noise of a window of that size, so on a quiet machine (pods alike) it is
near the test's own effect threshold and costs no power; on a noisy one it is what one window can tell apart.
Fewer than MIN_OBSERVATIONS: no floor (the exact test alone, as before); the newest MAX_OBSERVATIONS are kept.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict
from scipy import stats

from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, MetricsSnapshot

MIN_OBSERVATIONS = 3
MAX_OBSERVATIONS = 20


def noise_key(metric: LatencyMetric, percentile: int) -> str:
    return f"{metric.value}_p{percentile}"


def observed_percentiles(slo: SLOSpec) -> list[tuple[LatencyMetric, int]]:
    """Every SLO percentile, and each SLO metric's median (the canary rule falls back on it)."""
    found: list[tuple[LatencyMetric, int]] = []
    for target in slo.targets():
        for pair in ((target.metric, target.percentile), (target.metric, 50)):
            if pair not in found:
                found.append(pair)
    return found


class NoiseFloor(BaseModel):
    """A/A log ratios (first pod over the others) per percentile, newest last; kept in the loop's state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    log_ratios: dict[str, tuple[float, ...]] = {}

    def observe(self, others: MetricsSnapshot, first: MetricsSnapshot, slo: SLOSpec) -> NoiseFloor:
        """One A/A window's log ratios added (percentiles an arm has no value for are left out)."""
        ratios = dict(self.log_ratios)
        for metric, percentile in observed_percentiles(slo):
            a, b = others.latency(metric).at(percentile), first.latency(metric).at(percentile)
            if a and b and a > 0 and b > 0:
                key = noise_key(metric, percentile)
                ratios[key] = (*ratios.get(key, ()), math.log(b / a))[-MAX_OBSERVATIONS:]
        return NoiseFloor(log_ratios=ratios)

    def count(self, metric: LatencyMetric, percentile: int) -> int:
        return len(self.log_ratios.get(noise_key(metric, percentile), ()))

    def factor(self, metric: LatencyMetric, percentile: int, alpha: float) -> float:
        """The ratio (>= 1) a canary must exceed, either way, at one-sided level `alpha`; 1 with too few
        observations."""
        found = self.log_ratios.get(noise_key(metric, percentile), ())
        if len(found) < MIN_OBSERVATIONS:
            return 1.0
        rms = math.sqrt(sum(r * r for r in found) / len(found))
        return math.exp(float(stats.t.ppf(1 - alpha, len(found))) * rms)

    def explains(self, metric: LatencyMetric, percentile: int, ratio: float | None, alpha: float) -> float | None:
        """The floor when it explains `ratio` (canary over siblings) as the pods' own spread, else None."""
        factor = self.factor(metric, percentile, alpha)
        if ratio is None or ratio <= 0 or factor <= 1.0:
            return None
        return factor if 1 / factor <= ratio <= factor else None
