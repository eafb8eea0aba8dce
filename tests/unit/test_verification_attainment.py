"""Verification honours slo.attainment: a change is judged on whether the share of requests within the target meets
the declared attainment, not on the interpolated percentile alone."""

from __future__ import annotations

import numpy as np

from slotune.judge.verification import verify
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, LatencySummary, MetricsSnapshot, Source

SLO = SLOSpec.model_validate({"ttft": {"p99": 300}, "attainment": 0.995})
PERCENTILE_ONLY = SLOSpec.model_validate({"ttft": {"p99": 300}})


def _window(num_slow: int) -> MetricsSnapshot:
    """1,000 requests: fast ones spread over 20-200 ms, `num_slow` of them at 320 ms (just over the target)."""
    samples = np.concatenate([np.linspace(20, 200, 1000 - num_slow), np.full(num_slow, 320.0)])
    return MetricsSnapshot(Source.CLIENT, 60.0, 1000, ttft=LatencySummary.from_samples(samples))


def test_a_change_that_brings_the_share_within_the_target_to_the_attainment_is_kept() -> None:
    """99.2% -> 99.7% within 300 ms: the P99 is a fast request both times (nothing to see by percentile), the
    attainment of 99.5% goes from missed to met."""
    before, after = _window(8), _window(3)
    assert PERCENTILE_ONLY.is_met(before) and not verify(before, after, LatencyMetric.TTFT, 99, PERCENTILE_ONLY).keep
    assert not SLO.is_met(before) and SLO.is_met(after)
    verdict = verify(before, after, LatencyMetric.TTFT, 99, SLO)
    assert verdict.keep and verdict.slo_met_after and verdict.reason.startswith("SLO now met")


def test_a_change_that_loses_the_attainment_is_not_called_a_fix() -> None:
    before, after = _window(3), _window(8)
    verdict = verify(before, after, LatencyMetric.TTFT, 99, SLO)
    assert not verdict.keep and not verdict.slo_met_after
