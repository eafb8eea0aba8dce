"""A canary judged over up to MAX_LOOKS windows, its arms pooled, with the false-promote bound held over every look.

Each arm of a canary gets about 1/N of a window's requests (N pods), so a short window can leave the canary arm a
handful of requests: in the operator e2e a 10x faster canary was rolled back as "no gain" on 3 canary requests
against 9 of its sibling. Before/after answers an inconclusive tail with one more window, pooled; a canary does the
same, as a group-sequential test: after each window both arms are pooled with every earlier window of the same
canary (bucket counts summed, samples joined) and the whole of slotune.judge.canary's rule is run on the pools.

Looking again at data that grows is a new chance for a false promotion, so each look gets its own share of the
false-promote budget and the shares sum to ALPHA (Bonferroni over the looks, an alpha-spending plan fixed in advance):
the first look spends ALPHA / 2 (a window with enough requests decides at once, almost as before), each later look
ALPHA / 2 / (MAX_LOOKS - 1). Whatever the looks see, P(promote at some look | A/A) <= sum of the shares = ALPHA if
each look's test holds its level (the union bound; it needs no independence between looks, which share data).
A look is a window in which both arms served requests (an empty arm is not a test and spends nothing).
Another look is taken only when the canary is inconclusive and moved the right way (NO_GAIN with the targeted
estimate at least MIN_EFFECT better, the before/after rule, and its median not MIN_EFFECT worse), and never after
MAX_LOOKS: a canary that showed nothing by then, or moved the wrong way, is rolled back; a worse canary is rolled
back at the look that shows it.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import BaseModel, ConfigDict

from slotune.judge.canary import ALPHA, CanaryOutcome, CanaryVerdict, judge
from slotune.judge.canary_noise import NoiseFloor
from slotune.judge.verification import MIN_EFFECT
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, MetricsSnapshot

MAX_LOOKS = 3
_LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue", "prefill", "decode")


def look_alpha(look: int) -> float:
    """The false-promote share of look `look` (1-based); the shares of looks 1..MAX_LOOKS sum to ALPHA."""
    if not 1 <= look <= MAX_LOOKS:
        raise ValueError(f"look {look} outside 1..{MAX_LOOKS}")
    return ALPHA / 2 if look == 1 else ALPHA / 2 / (MAX_LOOKS - 1)


class CanaryPool(BaseModel):
    """Both arms of every window of one canary so far, pooled, and the looks taken (kept in the loop's state, so an
    operator restart mid-canary resumes the same sequential test)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    canary: MetricsSnapshot
    baseline: MetricsSnapshot
    windows: int = 1
    looks: int = 0


def pool_window(first: MetricsSnapshot, then: MetricsSnapshot) -> MetricsSnapshot:
    """Two windows of one arm as one: every latency pooled, requests and failures summed, the window lengths
    added; rates and gauges from the later window (the verdict reads latencies and failures only)."""
    pooled = {name: getattr(first, name).pooled(getattr(then, name)) for name in _LATENCIES}
    return replace(then, window_s=first.window_s + then.window_s, num_requests=first.num_requests + then.num_requests,
                   num_failed_requests=first.num_failed_requests + then.num_failed_requests, **pooled)


def pooled(earlier: CanaryPool | None, baseline: MetricsSnapshot, canary: MetricsSnapshot) -> CanaryPool:
    """This window's arms added to the canary's earlier windows."""
    if earlier is None:
        return CanaryPool(canary=canary, baseline=baseline)
    return CanaryPool(canary=pool_window(earlier.canary, canary), baseline=pool_window(earlier.baseline, baseline),
                      windows=earlier.windows + 1, looks=earlier.looks)


def judge_pooled(pool: CanaryPool, target: LatencyMetric, percentile: int, slo: SLOSpec,
                 floor: NoiseFloor | None = None) -> tuple[CanaryVerdict, CanaryPool, bool]:
    """The verdict on the pooled arms, the pool with this look counted, and whether it is final (False: pool the
    next window too; see the module docstring for when). `floor`: the pods' A/A spread of one window
    (slotune.judge.canary_noise), at this look's level: conservative for a pool of several windows."""
    look = pool.looks + 1
    verdict = judge(pool.baseline, pool.canary, target, percentile, slo, alpha=look_alpha(look), floor=floor)
    if verdict.outcome is CanaryOutcome.TOO_FEW_SAMPLES:
        return verdict, pool, False  # not a look: nothing was tested, nothing spent
    counted = pool.model_copy(update={"looks": look})
    ratio = verdict.targeted.ratio
    median = _ratio(pool, target, 50)
    # A tail that looks better by chance while the bulk is slower (a 1.5x slower canary's P99 on 100 requests)
    # is not worth another look: its median says which way it went.
    moved = ratio is not None and ratio <= 1 - MIN_EFFECT and (median is None or median < 1 + MIN_EFFECT)
    if verdict.outcome is CanaryOutcome.NO_GAIN and moved and look < MAX_LOOKS:
        return verdict, counted, False
    return verdict, counted, True


def _ratio(pool: CanaryPool, metric: LatencyMetric, percentile: int) -> float | None:
    a, b = pool.baseline.latency(metric).at(percentile), pool.canary.latency(metric).at(percentile)
    return b / a if a and b else None


METHOD = (f"canary, pooled over up to {MAX_LOOKS} windows: false-promote share {look_alpha(1):g} at the first look, "
          f"{look_alpha(2):g} at each later one ({ALPHA:g} in all, Bonferroni over looks)")
