"""The pods' own A/A spread as a floor under the canary rule (slotune.judge.canary_noise): pods that differ from window
to window by more than sampling (two processes on shared cores) make the exact test call an A/A canary worse or better
far more often than its level; with a floor learned from A/A windows of the same pods, both stay under it, and a 1.5x
slower canary is still rolled back at its first look. The loop learns the floor from windows without a canary (first pod
against the others, per-pod reads) and judges its canaries with it."""

from __future__ import annotations

import numpy as np
import pytest

from slotune.api.status import Phase, Verdict, Verification
from slotune.judge.canary import ALPHA, CanaryOutcome, judge
from slotune.judge.canary_noise import MAX_OBSERVATIONS, MIN_OBSERVATIONS, NoiseFloor
from slotune.judge.canary_pool import MAX_LOOKS, judge_pooled, pooled
from slotune.loop import TuningState
from slotune.loop.canary import observe_noise
from slotune.metrics.per_pod import FIRST_POD, split_arms
from slotune.metrics.window import WindowReadings
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, LatencySummary, MetricsSnapshot, Source
from tests.unit.test_canary import _slack
from tests.unit.test_loop_canary import OLD, Pods, _tuner

SLO = SLOSpec.model_validate({"ttft": {"p99": 1000}})  # the bench's: one target, its median the fallback
TRIALS = 400
N = 100  # requests an arm, a window
POD_SPREAD = 0.15  # sd of a pod's log speed, window to window: medians 1.2-1.5x apart in some windows


def _arm(rng: np.random.Generator, scale: float) -> MetricsSnapshot:
    ttft = rng.lognormal(np.log(50.0), 0.5, N) * scale
    return MetricsSnapshot(Source.SIMULATOR, 10.0, N, ttft=LatencySummary.from_samples(ttft))


def _window(rng: np.random.Generator, spread: float, slowdown: float = 1.0) -> tuple[MetricsSnapshot, ...]:
    """(sibling, canary) of one window: each pod as fast as the shared machine lets it be this window."""
    return (_arm(rng, float(np.exp(rng.normal(0, spread)))),
            _arm(rng, slowdown * float(np.exp(rng.normal(0, spread)))))


def _floor(rng: np.random.Generator, spread: float, windows: int = MAX_OBSERVATIONS) -> NoiseFloor:
    floor = NoiseFloor()
    for _ in range(windows):
        floor = floor.observe(*_window(rng, spread), SLO)
    return floor


def _rates(spread: float, slowdown: float, with_floor: bool, seed: int = 0) -> dict[CanaryOutcome, float]:
    """One window judged per trial, each with a floor of its own from MAX_OBSERVATIONS earlier A/A windows."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(TRIALS):
        floor = _floor(rng, spread) if with_floor else None
        found.append(judge(*_window(rng, spread, slowdown), LatencyMetric.TTFT, 99, SLO, floor=floor).outcome)
    return {outcome: found.count(outcome) / TRIALS for outcome in CanaryOutcome}


def test_pods_that_differ_window_to_window_break_the_exact_tests_level_and_the_floor_restores_it() -> None:
    bare = _rates(POD_SPREAD, 1.0, with_floor=False)
    assert bare[CanaryOutcome.WORSE] > 2 * ALPHA and bare[CanaryOutcome.PROMOTE] > ALPHA  # the problem, measured
    floored = _rates(POD_SPREAD, 1.0, with_floor=True)
    # Two tests (the P99's, the median's) each at ALPHA / 2 a side.
    assert floored[CanaryOutcome.WORSE] <= ALPHA + _slack(ALPHA), floored
    assert floored[CanaryOutcome.PROMOTE] <= ALPHA + _slack(ALPHA), floored


def test_a_1_5x_slower_canary_is_rolled_back_at_its_first_look_with_the_floor() -> None:
    rng = np.random.default_rng(1)
    worse = first = promoted = 0
    for _ in range(TRIALS):
        floor, pool, done = _floor(rng, POD_SPREAD), None, False
        while not done:  # the loop's whole procedure: looks pooled until one is final
            pool = pooled(pool, *_window(rng, POD_SPREAD, 1.5))
            verdict, pool, done = judge_pooled(pool, LatencyMetric.TTFT, 99, SLO, floor)
        promoted += verdict.outcome is CanaryOutcome.PROMOTE
        first += pool.looks == 1
        worse += pool.looks == 1 and verdict.outcome is CanaryOutcome.WORSE
    assert promoted == 0
    assert first / TRIALS >= 0.95  # rolled back in one window (another look only where pods' noise hid it)
    assert worse / TRIALS >= 0.25  # called worse, not only "no gain", where the pods' spread lets one window


def test_on_pods_alike_the_floor_costs_no_power() -> None:
    assert _rates(0.0, 1.5, with_floor=True)[CanaryOutcome.WORSE] >= 0.9
    floor = _floor(np.random.default_rng(2), 0.0)
    assert floor.factor(LatencyMetric.TTFT, 50, ALPHA / 2) < 1.3  # sampling noise of a window of N alone


def test_the_floor_needs_observations_and_keeps_the_newest() -> None:
    rng = np.random.default_rng(3)
    assert _floor(rng, POD_SPREAD, MIN_OBSERVATIONS - 1).factor(LatencyMetric.TTFT, 50, 0.025) == 1.0
    floor = _floor(rng, POD_SPREAD, MAX_OBSERVATIONS + 5)
    assert floor.count(LatencyMetric.TTFT, 50) == floor.count(LatencyMetric.TTFT, 99) == MAX_OBSERVATIONS
    assert floor.factor(LatencyMetric.TTFT, 50, 0.0125) > floor.factor(LatencyMetric.TTFT, 50, 0.025) > 1.0
    assert floor.explains(LatencyMetric.TTFT, 50, 1.01, 0.025) and not floor.explains(LatencyMetric.TTFT, 50, 3.0,
                                                                                        0.025)
    again = NoiseFloor.model_validate_json(floor.model_dump_json())  # saved in the loop's state
    assert again == floor


def test_a_window_without_a_canary_splits_as_a_canary_would_first_pod_against_the_others() -> None:
    by_pod = {name: WindowReadings(window_s=10.0, num_requests=n) for name, n in (("b", 3), ("a", 1), ("c", 5))}
    arms = split_arms(by_pod, FIRST_POD)
    assert (arms.canary_pod, arms.baseline_pods) == ("a", ("b", "c"))
    assert (arms.canary.num_requests, arms.baseline.num_requests) == (1, 8)


def test_the_loop_learns_the_floor_from_windows_without_a_canary_and_judges_canaries_with_it() -> None:
    pods = Pods(canary_scale=0.5)
    asked: list[str] = []
    arms = pods.arms
    pods.arms = lambda pod: (asked.append(pod), arms(pod))[1]  # type: ignore[method-assign]
    tuner, store = _tuner(pods)
    canary = store.load()
    assert canary is not None
    store.save(TuningState(phase=Phase.MEASURING, current=OLD))  # every pod on one config
    state = tuner.step()
    assert asked == [FIRST_POD] and state.noise_floor is not None
    assert state.noise_floor.count(LatencyMetric.TTFT, 99) == state.noise_floor.count(LatencyMetric.TTFT, 50) == 1
    one_pod = TuningState(phase=Phase.MEASURING, current=OLD.with_changes(replicas=1))
    assert observe_noise(pods, one_pod, SLO) is None and asked == [FIRST_POD]  # no siblings, no read
    # A canary 2x faster than its siblings, promoted without a floor (test_loop_canary), is within pods that
    # measured x2.7 apart under A/A: rolled back as no gain, and its windows are not A/A observations.
    wide = NoiseFloor(log_ratios={"ttft_p50": (1.0, -1.0, 1.0), "ttft_p99": (1.0, -1.0, 1.0)})
    store.save(canary.evolve(noise_floor=wide))
    asked.clear()
    tuner.step()
    for _ in range(MAX_LOOKS):  # a gain within the spread: no gain at each look, pooled while it moves the right way
        if (state := tuner.step()).history:
            break
    assert FIRST_POD not in asked and state.noise_floor == wide
    entry = state.history[0]
    assert entry.verdict is Verdict.ROLLED_BACK and entry.verification is Verification.CANARY
    assert "within the pods' A/A spread" in entry.detail


@pytest.mark.parametrize("ratio", [0.5, 2.0])
def test_a_shift_within_the_floor_is_no_change_and_the_verdict_says_so(ratio: float) -> None:
    rng = np.random.default_rng(4)
    sibling, canary = _arm(rng, 1.0), _arm(rng, ratio)
    wide = NoiseFloor(log_ratios={"ttft_p50": (1.0, -1.0, 1.0), "ttft_p99": (1.0, -1.0, 1.0)})  # pods x2.7 apart
    assert judge(sibling, canary, LatencyMetric.TTFT, 99, SLO).outcome in (CanaryOutcome.PROMOTE,
                                                                           CanaryOutcome.WORSE)
    verdict = judge(sibling, canary, LatencyMetric.TTFT, 99, SLO, floor=wide)
    assert verdict.outcome is CanaryOutcome.NO_GAIN and "within the pods' A/A spread" in verdict.reason
