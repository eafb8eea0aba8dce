"""The loop's side of canary verification: when a change is tried as a canary, and how its window is judged.

A backend that can run a candidate on one replica (`CanaryBackend`, the Kubernetes one) and a source that can read
a window per replica (`CanarySource`, Prometheus grouped by pod) make a change a canary when the backend agrees (a
live change, same replica count, two or more ready replicas). The window of the canary is judged by slotune.canary
(the canary pod against its siblings over the same window) instead of before/after; the verdict says which was
used. Without either capability, for a trim (a replica change), or for a change that can alter outputs (its quality
gate probes through the Service, which would mix both arms), the change is verified before/after as ever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from slotune.canary import CanaryOutcome
from slotune.canary_pool import MAX_LOOKS, CanaryPool, judge_pooled, pooled
from slotune.knobs import QUALITY_KNOBS, RuntimeConfig
from slotune.loop.protocols import ApplyResult
from slotune.loop.state import PendingChange
from slotune.metrics.per_pod import ArmWindows
from slotune.metrics.window import MetricsUnavailable
from slotune.slo import SLOSpec
from slotune.verification import MetricChange, Verification

BEFORE_AFTER = "before/after (the window before the change vs the window after it)"


class Started(Protocol):
    pod: str
    result: ApplyResult


@runtime_checkable
class CanaryBackend(Protocol):
    def start_canary(self, running: RuntimeConfig, candidate: RuntimeConfig) -> Started | None:
        """Run `candidate` on one replica, the others untouched; None when this change cannot be a canary."""
        ...

    def end_canary(self) -> None:
        """Forget the canary: the next apply brings every replica to the config it is asked for."""
        ...


@runtime_checkable
class CanarySource(Protocol):
    def arms(self, canary_pod: str) -> ArmWindows:
        """The window `measure` last returned, split into the canary pod and its siblings pooled."""
        ...


@dataclass(frozen=True)
class CanaryStarted:
    pod: str
    result: ApplyResult


def start(backend: object, source: object, pending: PendingChange) -> CanaryStarted | None:
    """Try `pending` as a canary; None when it is verified before/after (see the module docstring)."""
    if pending.trim or not isinstance(backend, CanaryBackend) or not isinstance(source, CanarySource):
        return None
    if pending.previous.changed_knobs(pending.config) & QUALITY_KNOBS:
        return None  # the quality gate probes through the Service: it would read both arms mixed
    started = backend.start_canary(pending.previous, pending.config)
    return None if started is None else CanaryStarted(started.pod, started.result)


@dataclass(frozen=True)
class Unjudged:
    """No verdict on the canary yet: `lost` when an arm has no series at all (the canary pod was replaced, say: the
    canary starts again), else too few requests in an arm or an inconclusive look (slotune.canary_pool): `pool`
    holds both arms so far, pooled with the next window."""

    lost: bool
    reason: str
    pool: CanaryPool | None = None


def verification(source: object, pending: PendingChange, slo: SLOSpec) -> Verification | Unjudged:
    """The canary's verdict on its windows so far (this one pooled with the earlier ones, slotune.canary_pool), as
    the loop's Verification, or why there is none yet."""
    assert pending.canary_pod is not None and isinstance(source, CanarySource)
    try:
        arms = source.arms(pending.canary_pod)
    except MetricsUnavailable as error:
        return Unjudged(lost=True, reason=error.message)
    pool = pooled(pending.canary_pool, arms.baseline, arms.canary)
    verdict, pool, final = judge_pooled(pool, pending.target_metric, pending.target_percentile, slo)
    seen = (f"{arms.describe()}; pooled over {pool.windows} window(s): {pool.canary.num_requests} vs "
            f"{pool.baseline.num_requests} requests")
    if verdict.outcome is CanaryOutcome.TOO_FEW_SAMPLES:
        return Unjudged(lost=False, reason=f"{seen}: {verdict.reason}", pool=pool)
    if not final:
        return Unjudged(lost=False, pool=pool, reason=(
            f"{seen}: {verdict.reason}; inconclusive at look {pool.looks} of {MAX_LOOKS}"))
    test = verdict.targeted
    targeted = MetricChange(f"{pending.target_metric.value}_p{pending.target_percentile}", test.a_ms, test.b_ms,
                            math.nan, math.nan, verdict.promote, verdict.outcome is CanaryOutcome.WORSE,
                            f"quantile test p={min(test.p_better, test.p_worse):.2g}")
    regressions = (verdict.reason,) if verdict.outcome is CanaryOutcome.WORSE else ()
    return Verification(verdict.promote, f"canary verification at look {pool.looks} of {MAX_LOOKS}, {seen}: "
                        f"{verdict.reason}", targeted, regressions, slo.is_met(pool.canary))
