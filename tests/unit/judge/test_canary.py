"""Canary verification's decision rule (slotune.judge.canary): its false-promote rate under A/A is at most its alpha, it
catches a 1.5x slowdown of the canary and promotes a 1.5x speed-up, on samples and on the runtime's bucket counts;
and the per-pod arms pool the siblings' readings (slotune.metrics.per_pod)."""

from __future__ import annotations

import numpy as np
import pytest

from slotune.judge.canary import ALPHA, CanaryOutcome, judge
from slotune.metrics.per_pod import pool_readings, split_arms
from slotune.metrics.window import LengthTotals, MetricsUnavailable, WindowReadings
from slotune.slo import SLOSpec
from slotune.snapshot import Histogram, LatencyMetric, LatencySummary, MetricsSnapshot, Source

SLO = SLOSpec.model_validate({"ttft": {"p99": 2000, "p50": 400}, "tpot": {"p99": 100}})
TRIALS = 400
# Bucket bounds like the builtin runtime's TTFT histogram (seconds).
EDGES = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, float("inf"))


SHORT = (*EDGES[:3], float("inf"))


def _summary(samples_s: np.ndarray, as_histogram: bool) -> LatencySummary:
    if not as_histogram:
        return LatencySummary.from_samples(samples_s * 1000.0)
    counts = np.histogram(samples_s, bins=(0.0, *EDGES[:-1], np.inf))[0]
    return LatencySummary.from_histogram(Histogram(EDGES, tuple(float(c) for c in counts)))


def _arm(rng: np.random.Generator, n: int, ttft_scale: float, as_histogram: bool) -> MetricsSnapshot:
    ttft = rng.lognormal(np.log(0.2), 0.6, n) * ttft_scale
    tpot = rng.lognormal(np.log(0.03), 0.3, n)
    return MetricsSnapshot(Source.SIMULATOR, 10.0, num_requests=n, ttft=_summary(ttft, as_histogram),
                           tpot=_summary(tpot, as_histogram))


def _outcomes(canary_scale: float, as_histogram: bool, n: int = 200, seed: int = 0) -> dict[CanaryOutcome, float]:
    rng = np.random.default_rng(seed)
    found = [judge(_arm(rng, 2 * n, 1.0, as_histogram), _arm(rng, n, canary_scale, as_histogram),
                   LatencyMetric.TTFT, 99, SLO).outcome for _ in range(TRIALS)]
    return {outcome: found.count(outcome) / TRIALS for outcome in CanaryOutcome}


def _slack(rate: float) -> float:
    """Three binomial standard errors over TRIALS: a rate at `rate` stays under rate + slack but for 1 in 700."""
    return 3 * float(np.sqrt(rate * (1 - rate) / TRIALS))


@pytest.mark.parametrize("as_histogram", [False, True], ids=["samples", "buckets"])
def test_a_a_promotes_at_most_alpha_of_the_time(as_histogram: bool) -> None:
    rates = _outcomes(1.0, as_histogram)
    assert rates[CanaryOutcome.PROMOTE] <= ALPHA + _slack(ALPHA)
    # Three percentiles are each tested for "worse" at ALPHA / 2: a false rollback-as-worse is at most 1.5 x ALPHA.
    assert rates[CanaryOutcome.WORSE] <= 1.5 * ALPHA + _slack(1.5 * ALPHA)
    assert rates[CanaryOutcome.NO_GAIN] >= 0.85


@pytest.mark.parametrize("as_histogram", [False, True], ids=["samples", "buckets"])
def test_a_canary_1_5x_slower_is_rolled_back_as_worse(as_histogram: bool) -> None:
    assert _outcomes(1.5, as_histogram)[CanaryOutcome.WORSE] >= 0.95


@pytest.mark.parametrize("as_histogram", [False, True], ids=["samples", "buckets"])
def test_a_canary_1_5x_faster_is_promoted(as_histogram: bool) -> None:
    assert _outcomes(1 / 1.5, as_histogram)[CanaryOutcome.PROMOTE] >= 0.95


def test_a_faster_target_does_not_excuse_another_percentile_worse() -> None:
    rng = np.random.default_rng(1)
    baseline, canary = _arm(rng, 400, 1.0, False), _arm(rng, 200, 0.5, False)
    slow_tpot = LatencySummary.from_samples(np.asarray(canary.tpot.samples_ms) * 2.0)
    slower = MetricsSnapshot(Source.SIMULATOR, 10.0, num_requests=200, ttft=canary.ttft, tpot=slow_tpot)
    verdict = judge(baseline, slower, LatencyMetric.TTFT, 99, SLO)
    assert verdict.outcome is CanaryOutcome.WORSE and "tpot_p99" in verdict.reason


def test_an_arm_without_requests_is_not_judged() -> None:
    rng = np.random.default_rng(2)
    verdict = judge(_arm(rng, 100, 1.0, True), MetricsSnapshot(Source.SIMULATOR, 10.0, 0), LatencyMetric.TTFT, 99, SLO)
    assert verdict.outcome is CanaryOutcome.TOO_FEW_SAMPLES and not verdict.promote


def _readings(counts: tuple[float, ...], requests: float, running: float) -> WindowReadings:
    ttft = LatencySummary.from_histogram(Histogram(SHORT, counts))
    return WindowReadings(window_s=10.0, latencies={LatencyMetric.TTFT: ttft}, num_requests=requests,
                          generation_tokens=requests * 10, num_running_mean=running,
                          prompt_lengths=LengthTotals(requests * running * 100, requests))


def test_siblings_pool_counts_and_average_gauges_the_canary_stands_alone() -> None:
    by_pod = {"a": _readings((1, 2, 3, 0), 6, 2.0), "b": _readings((0, 1, 1, 2), 4, 4.0),
              "c": _readings((5, 0, 0, 0), 5, 1.0)}
    pooled = pool_readings([by_pod["a"], by_pod["b"]])
    assert pooled.latencies[LatencyMetric.TTFT].histogram == Histogram(SHORT, (1, 3, 4, 2))
    assert (pooled.num_requests, pooled.generation_tokens, pooled.num_running_mean) == (10, 100, 3.0)
    assert pooled.to_snapshot(Source.PROMETHEUS).mean_prompt_tokens == (6 * 200 + 4 * 400) / 10  # per request
    arms = split_arms(by_pod, "c")
    assert arms.baseline_pods == ("a", "b")
    assert (arms.canary.num_requests, arms.baseline.num_requests) == (5, 10)
    with pytest.raises(MetricsUnavailable):
        split_arms({"c": by_pod["c"]}, "c")  # no siblings in the window
    with pytest.raises(MetricsUnavailable):
        split_arms(by_pod, "gone")  # the canary pod has no series
