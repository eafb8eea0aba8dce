"""The SLO holds with confidence, not by a point estimate (issue 16, item 4): an order-statistic upper bound on each
percentile, pooled over windows, with the margin stated."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from scipy import stats

from slotune.judge.slo_bound import bounds, holds, order_statistic_rank, pool, tightened, upper_bound_ms
from slotune.slo import SLOSpec
from slotune.snapshot import LatencySummary, MetricsSnapshot, Source

SLO = SLOSpec.model_validate({"ttft": {"p99": 800}})


def _window(samples: np.ndarray, failed: int = 0) -> MetricsSnapshot:
    return MetricsSnapshot(Source.SIMULATOR, 60.0, samples.size, ttft=LatencySummary.from_samples(samples),
                           num_failed_requests=failed)


def test_the_rank_is_the_smallest_order_statistic_with_the_confidence():
    assert order_statistic_rank(150, 99, 0.8) is None  # 0.99^150 = 0.22: even the largest of 150 is not enough
    k = order_statistic_rank(300, 99, 0.8)
    assert k is not None and stats.binom.cdf(k - 1, 300, 0.99) >= 0.8 > stats.binom.cdf(k - 2, 300, 0.99)
    assert order_statistic_rank(300, 50, 0.8) == int(stats.binom.ppf(0.8, 300, 0.5)) + 1


def test_a_p99_just_under_its_target_on_two_windows_does_not_hold():
    """The issue's case: 799.66 ms and 747 ms against 800 ms. The point estimates meet it; the bound does not."""
    rng = np.random.default_rng(0)
    first, then = rng.lognormal(5.5, 0.45, 150), rng.lognormal(5.5, 0.45, 150)
    slo = SLOSpec.model_validate({"ttft": {"p99": float(max(np.percentile(first, 99), np.percentile(then, 99)))}})
    assert slo.is_met(_window(first)) and slo.is_met(_window(then))
    windows = [_window(first), _window(then)]
    assert not holds(slo, windows[:1])  # one window cannot bound a p99 at all
    assert not holds(slo, windows)
    roomy = SLOSpec.model_validate({"ttft": {"p99": 2 * slo.ttft.p99}})  # type: ignore[union-attr]
    assert holds(roomy, windows)
    margin = bounds(roomy, windows)[0].margin
    assert margin is not None and 0 < margin < 0.5


def test_a_bound_that_misses_tightens_the_target_so_the_window_violates_it():
    rng = np.random.default_rng(1)
    windows = [_window(rng.lognormal(5.5, 0.45, 150)), _window(rng.lognormal(5.5, 0.45, 150))]
    pooled = pool(*windows)
    observed = pooled.ttft.p99_ms
    assert observed is not None
    slo = SLOSpec.model_validate({"ttft": {"p99": observed * 1.01}})
    assert slo.is_met(pooled) and not holds(slo, windows)
    assert not tightened(slo, bounds(slo, windows)).is_met(pooled)


def test_windows_whose_percentiles_vary_widen_the_bound():
    """Pooled samples hide how much one window's P99 differs from the next; the prediction bound does not."""
    rng = np.random.default_rng(2)
    calm, burst = rng.lognormal(5.5, 0.3, 150), rng.lognormal(5.5, 0.3, 150) * 1.6
    pooled = pool(_window(calm), _window(burst))
    order_only = upper_bound_ms(pooled.ttft, 99)
    both = bounds(SLO, [_window(calm), _window(burst)])[0].upper_ms
    assert order_only is not None and both is not None and both > order_only


def test_failed_requests_count_above_every_target():
    samples = np.full(400, 100.0)
    assert upper_bound_ms(LatencySummary.from_samples(samples), 99) == pytest.approx(100.0)
    assert upper_bound_ms(LatencySummary.from_samples(samples), 99, failed=10) == float("inf")


def test_the_next_windows_percentile_is_predicted_at_90_percent():
    """chat-h100-interactive (bursty chat, TTFT P99 <= 500 ms) converged on three windows whose P99s were 441, 397
    and 248 ms: predicted at 80%, the next window's P99 stays under 486 ms, so the config was called held; it then
    missed one of three fresh windows at 559 ms (and 3 of 15 windows for a summarization config converged the same
    way). Predicted at 90% the bound is over the target: the windows disagree too much to claim the next one."""
    from slotune.judge.slo_bound import NEXT_WINDOW_CONFIDENCE, prediction_bound

    rng = np.random.default_rng(3)
    windows = []
    for p99 in (441.0, 397.0, 248.0):
        samples = rng.lognormal(5.0, 0.4, 150)
        windows.append(_window(samples * p99 / np.percentile(samples, 99)))  # this window's P99 is exactly p99
    slo = SLOSpec.model_validate({"ttft": {"p99": 500}})
    per_window = [w.ttft.p99_ms for w in windows]
    assert all(slo.is_met(w) for w in windows)
    order_only = upper_bound_ms(functools.reduce(pool, windows).ttft, 99)
    assert order_only is not None and order_only < 500  # the pooled tail alone holds
    assert prediction_bound(per_window, 0.8) < 500 < prediction_bound(per_window, 0.9)  # type: ignore[arg-type,operator]
    assert NEXT_WINDOW_CONFIDENCE == 0.9
    found = bounds(slo, windows)[0]
    assert not found.holds and found.upper_ms == pytest.approx(prediction_bound(per_window, 0.9))  # type: ignore[arg-type]
    assert "90% for the next window" in found.describe()
    assert not holds(slo, windows)
