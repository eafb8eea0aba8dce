"""The loop's side of canary verification: when a change is tried as a canary, and how its window is judged.

A backend that can run a candidate on one replica (`CanaryBackend`, the Kubernetes one) and a source that can read
a window per replica (`CanarySource`, Prometheus grouped by pod) make a change a canary when the backend agrees (a
live change, same replica count, two or more ready replicas). The window of the canary is judged by slotune.judge.canary
(the canary pod against its siblings over the same window) instead of before/after; the verdict says which was
used. Without either capability, or for a trim (a replica change), the change is verified before/after as ever.

A change that can alter outputs (8-bit weights, the KV dtype, speculation) is a canary too when the backend names
the canary pod's endpoint: its quality gate probes that pod alone (the Service would mix both configs' answers)
and is judged first, before any latency window (`quality_first`), so a change that breaks quality is rolled back
on the canary pod as soon as it is measured, having served only that pod's share of the traffic; one that holds is
then judged on latency as any canary. A backend that names no endpoint verifies such a change before/after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from slotune.api.status import Phase
from slotune.judge.canary import CanaryOutcome
from slotune.judge.canary_noise import MAX_OBSERVATIONS, NoiseFloor
from slotune.judge.canary_pool import MAX_LOOKS, CanaryPool, judge_pooled, pooled
from slotune.judge.verification import Judgement, MetricChange
from slotune.knobs import RuntimeConfig
from slotune.loop.protocols import ApplyResult
from slotune.loop.state import PendingChange, TuningState
from slotune.metrics.per_pod import FIRST_POD, ArmWindows
from slotune.metrics.window import MetricsUnavailable
from slotune.quality.gate import QualityProbe, QualityVerdict
from slotune.slo import SLOSpec

BEFORE_AFTER = "before/after (the window before the change vs the window after it)"


class Started(Protocol):
    pod: str
    result: ApplyResult  # the backend may also name `endpoint`: the canary pod's OpenAI base URL


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
    endpoint: str | None = None


def start(backend: object, source: object, pending: PendingChange, gated: bool = False) -> CanaryStarted | None:
    """Try `pending` as a canary; None when it is verified before/after (see the module docstring). `gated`: the
    change is judged by the quality gate, which needs the canary pod's own endpoint."""
    if pending.trim or not isinstance(backend, CanaryBackend) or not isinstance(source, CanarySource):
        return None
    started = backend.start_canary(pending.previous, pending.config)
    if started is None:
        return None
    endpoint = getattr(started, "endpoint", None)
    if gated and started.result.ok and not endpoint:
        backend.end_canary()  # no way to probe the canary alone: before/after, every pod on the candidate
        return None
    return CanaryStarted(started.pod, started.result, endpoint)


def quality_first(quality: QualityProbe | None, pending: PendingChange | None) -> QualityVerdict | None:
    """The quality gate's word on an applied canary, probed on the canary pod alone, when it holds the canary up:
    still measuring (`pending`) or broken. None when the latency windows may be judged: no canary, a change that
    cannot alter outputs, or quality that holds."""
    if quality is None or pending is None or not pending.applied or pending.canary_pod is None:
        return None
    verdict = quality.check(pending.previous, pending.config, pending.canary_endpoint)
    return None if verdict is None or verdict.keep else verdict


@dataclass(frozen=True)
class Unjudged:
    """No verdict on the canary yet: `lost` when an arm has no series at all (the canary pod was replaced, say: the
    canary starts again), else too few requests in an arm or an inconclusive look (slotune.judge.canary_pool): `pool`
    holds both arms so far, pooled with the next window."""

    lost: bool
    reason: str
    pool: CanaryPool | None = None


def observe_noise(source: object, state: TuningState, slo: SLOSpec) -> NoiseFloor | None:
    """The state's A/A floor with this window added (slotune.judge.canary_noise) when every pod ran one config
    through it: no canary, two or more replicas, a source that reads per pod. At rest with a full floor it is left as
    it is (a per-pod read a window for each of a fleet of converged models buys nothing until the next canary)."""
    floor = state.noise_floor
    pending = state.pending
    if (pending is not None and pending.canary_pod is not None) or state.running.replicas < 2 \
            or not isinstance(source, CanarySource):
        return floor
    full = floor is not None and min((len(r) for r in floor.log_ratios.values()), default=0) >= MAX_OBSERVATIONS
    if full and state.phase in (Phase.CONVERGED, Phase.INFEASIBLE):
        return floor
    try:
        arms = source.arms(FIRST_POD)
    except MetricsUnavailable:
        return floor
    if min(arms.canary.num_requests, arms.baseline.num_requests) == 0:
        return floor
    return (floor or NoiseFloor()).observe(arms.baseline, arms.canary, slo)


def verification(source: object, pending: PendingChange, slo: SLOSpec,
                 floor: NoiseFloor | None = None) -> Judgement | Unjudged:
    """The canary's verdict on its windows so far (this one pooled with the earlier ones, slotune.judge.canary_pool), as
    the loop's Judgement, or why there is none yet; `floor`: the pods' A/A spread (slotune.judge.canary_noise)."""
    assert pending.canary_pod is not None and isinstance(source, CanarySource)
    try:
        arms = source.arms(pending.canary_pod)
    except MetricsUnavailable as error:
        return Unjudged(lost=True, reason=error.message)
    pool = pooled(pending.canary_pool, arms.baseline, arms.canary)
    verdict, pool, final = judge_pooled(pool, pending.target_metric, pending.target_percentile, slo, floor)
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
    return Judgement(verdict.promote, f"canary verification at look {pool.looks} of {MAX_LOOKS}, {seen}: "
                        f"{verdict.reason}", targeted, regressions, slo.is_met(pool.canary))
