"""A canary judged over several windows, its arms pooled (slotune.judge.canary_pool): a large gain on a handful of
requests a window is promoted once the windows add up; under A/A the whole sequential procedure, every look counted,
promotes at most ALPHA of the time; an inconclusive canary ends after MAX_LOOKS windows; an operator restarted
mid-canary resumes the same pooled test (the pool lives in the loop's saved state)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from slotune.api.status import Verdict, Verification
from slotune.judge.canary import ALPHA, CanaryOutcome
from slotune.judge.canary_pool import MAX_LOOKS, CanaryPool, judge_pooled, look_alpha, pooled
from slotune.loop import Tuner
from slotune.metrics.per_pod import ArmWindows
from slotune.snapshot import LatencyMetric, LatencySummary, MetricsSnapshot, Source
from tests.unit.test_canary import SLO, TRIALS, _arm, _slack
from tests.unit.test_loop_canary import NEW, OLD, Pods, _tuner


def test_the_looks_shares_of_the_false_promote_budget_sum_to_alpha() -> None:
    assert sum(look_alpha(look) for look in range(1, MAX_LOOKS + 1)) == pytest.approx(ALPHA)
    assert look_alpha(1) == ALPHA / 2  # a window with enough requests decides at once, as before pooling
    with pytest.raises(ValueError):
        look_alpha(MAX_LOOKS + 1)


def _sequential(canary_scale: float, n: int, as_histogram: bool, seed: int = 0) -> dict[CanaryOutcome, float]:
    """The whole procedure per trial: a window of both arms (n canary requests, 2n sibling ones), pooled and judged,
    until a look is final."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(TRIALS):
        pool: CanaryPool | None = None
        final = False
        while not final:
            pool = pooled(pool, _arm(rng, 2 * n, 1.0, as_histogram), _arm(rng, n, canary_scale, as_histogram))
            verdict, pool, final = judge_pooled(pool, LatencyMetric.TTFT, 99, SLO)
        assert pool.looks <= MAX_LOOKS
        found.append(verdict.outcome)
    return {outcome: found.count(outcome) / TRIALS for outcome in CanaryOutcome}


@pytest.mark.parametrize("n", [5, 200], ids=["5-requests", "200-requests"])
@pytest.mark.parametrize("as_histogram", [False, True], ids=["samples", "buckets"])
def test_a_a_over_every_look_promotes_at_most_alpha_of_the_time(as_histogram: bool, n: int) -> None:
    rates = _sequential(1.0, n, as_histogram)
    assert rates[CanaryOutcome.PROMOTE] <= ALPHA + _slack(ALPHA)
    assert rates[CanaryOutcome.WORSE] <= 1.5 * ALPHA + _slack(1.5 * ALPHA)


@pytest.mark.parametrize("as_histogram", [False, True], ids=["samples", "buckets"])
def test_a_canary_ten_times_faster_on_five_requests_a_window_is_promoted(as_histogram: bool) -> None:
    assert _sequential(0.1, 5, as_histogram)[CanaryOutcome.PROMOTE] >= 0.95


@pytest.mark.parametrize("as_histogram", [False, True], ids=["samples", "buckets"])
def test_a_canary_1_5x_slower_is_still_caught_at_its_first_look(as_histogram: bool) -> None:
    assert _sequential(1.5, 200, as_histogram)[CanaryOutcome.WORSE] >= 0.95


def _fixed(values_ms: list[float]) -> MetricsSnapshot:
    return MetricsSnapshot(Source.SIMULATOR, 6.0, len(values_ms), ttft=LatencySummary.from_samples(values_ms))


SIBLING_MS = [400.0 + 20 * i for i in range(9)]  # 9 requests a window on the sibling, as in the operator e2e


@dataclass
class FewRequests(Pods):
    """The operator e2e's windows: the canary serves 3 requests a window, its sibling 9."""

    canary_ms: list[float] = field(default_factory=lambda: [v / 10 for v in SIBLING_MS[::3]])  # 10x faster

    def arms(self, canary_pod: str) -> ArmWindows:
        return ArmWindows(canary_pod, _fixed(self.canary_ms), ("p1",), _fixed(SIBLING_MS))


def test_a_canary_ten_times_faster_on_three_requests_a_window_is_promoted_once_pooled() -> None:
    """Judged one window at a time, this canary was rolled back as "no gain": with 3 vs 9 requests the median test's
    smallest p-value (no canary request above the pooled median) is C(6, 3) / C(12, 3) = 0.09; pooled, it is
    promoted."""
    pods = FewRequests()
    tuner, _ = _tuner(pods)
    state = tuner.step()
    assert state.pending is not None and state.pending.canary_pod == "p0"
    for look in range(1, MAX_LOOKS + 1):
        state = tuner.step()
        if state.pending is None:
            break
        assert not state.history and state.pending.canary_pool is not None
        assert state.pending.canary_pool.looks == look and "judging the next window pooled" in state.message
    assert state.pending is None and state.current == NEW
    (entry,) = state.history
    assert entry.verdict is Verdict.KEPT and entry.verification is Verification.CANARY
    assert "pooled over" in entry.detail and pods.configs == dict.fromkeys(pods.configs, NEW)


def test_an_inconclusive_canary_is_rolled_back_after_max_looks() -> None:
    """A canary whose tail moved the right way (x0.86) but never beyond noise gets MAX_LOOKS windows, no more."""
    pods = FewRequests(canary_ms=[400.0, 460.0, 480.0])
    tuner, _ = _tuner(pods)
    tuner.step()
    for _ in range(MAX_LOOKS - 1):
        state = tuner.step()
        assert state.pending is not None and not state.history
    state = tuner.step()
    (entry, *_) = state.history
    assert entry.verdict is Verdict.ROLLED_BACK and f"look {MAX_LOOKS} of {MAX_LOOKS}" in entry.detail
    assert "not better" in entry.detail and state.current == OLD and pods.configs["p1"] == OLD


def test_a_canary_that_moved_the_wrong_way_is_rolled_back_at_once() -> None:
    pods = FewRequests(canary_ms=[v * 1.1 for v in SIBLING_MS[::3]])
    tuner, _ = _tuner(pods)
    tuner.step()
    state = tuner.step()
    assert state.history[0].verdict is Verdict.ROLLED_BACK and "look 1 of" in state.history[0].detail


def test_a_restarted_operator_resumes_the_pooled_canary() -> None:
    pods = FewRequests()
    tuner, store = _tuner(pods)
    tuner.step()
    state = tuner.step()
    assert state.pending is not None and state.pending.canary_pool is not None
    assert state.pending.canary_pool.windows == 1
    resumed = Tuner(tuner.problem, pods, pods, store)  # a new process: the state read back from its JSON
    state = resumed.step()
    assert state.pending is None or (state.pending.canary_pool is not None and state.pending.canary_pool.windows == 2)
    while state.pending is not None:
        state = resumed.step()
    assert state.history[0].verdict is Verdict.KEPT and "pooled over" in state.history[0].detail
