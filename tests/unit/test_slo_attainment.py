"""slo.attainment (issue 18, item 2): the share of requests within a target, counted, is the acceptance criterion
where set; with vLLM's fixed buckets the share is bracketed by the counts at the edges of the target's bucket."""

from __future__ import annotations

import numpy as np
import pytest

from slotune.judge.attainment import as_percentiles, interpolation_evidence, observed
from slotune.judge.slo_bound import bounds, order_statistic_rank, share_lower_bound
from slotune.slo import SLOSpec, attained
from slotune.snapshot import Histogram, LatencySummary, MetricsSnapshot, Source

VLLM_TTFT_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, float("inf"))


def _histogram(samples_ms: np.ndarray, edges_s: tuple[float, ...]) -> Histogram:
    upper = tuple(sorted(set(edges_s)))
    counts = np.histogram(samples_ms / 1000.0, bins=(0.0, *upper[:-1], np.inf))[0]
    return Histogram(upper, tuple(float(c) for c in counts))


def _window(ttft: LatencySummary, failed: int = 0) -> MetricsSnapshot:
    return MetricsSnapshot(Source.PROMETHEUS, 60.0, ttft.count, ttft=ttft, num_failed_requests=failed)


def _skewed(n_fast: int, n_slow: int, slow_ms: float) -> np.ndarray:
    """Most requests fast; the slow ones packed just above 250 ms, so inside (250, 500] the mass is not uniform."""
    return np.concatenate([np.linspace(20, 90, n_fast), np.full(n_slow, slow_ms)])


def test_samples_are_counted_exactly_and_failures_count_outside() -> None:
    found = attained(LatencySummary.from_samples([10.0, 20.0, 30.0, 40.0]), 25.0, failed=1)
    assert found is not None and found.exact and found.within == 2 and found.total == 5 and found.fraction == 0.4


def test_an_edge_at_the_target_counts_exactly_and_without_one_the_bucket_brackets_it() -> None:
    samples = _skewed(980, 20, 280.0)  # 98% within 300 ms
    exact = attained(LatencySummary.from_histogram(_histogram(samples, (*VLLM_TTFT_S, 0.3))), 300.0)
    vllm = attained(LatencySummary.from_histogram(_histogram(samples, VLLM_TTFT_S)), 300.0)
    assert exact is not None and exact.exact and exact.fraction == 1.0
    assert vllm is not None and not vllm.exact and vllm.bucket_ms == (250.0, 500.0)
    assert vllm.fraction_low == pytest.approx(0.98) and vllm.fraction_high == 1.0
    assert vllm.fraction_low < vllm.fraction < vllm.fraction_high


def test_attainment_judges_only_each_metrics_loosest_target_and_only_where_set() -> None:
    spec = {"ttft": {"p50": 100, "p99": 300}, "tpot": {"p95": 50}}
    unset, set_ = SLOSpec.model_validate(spec), SLOSpec.model_validate({**spec, "attainment": 0.99})
    assert all(unset.required(t) is None for t in unset.targets())
    assert {t.name: set_.required(t) for t in set_.targets()} == {"ttft_p50": None, "ttft_p99": 0.99,
                                                                  "tpot_p95": 0.99}


def test_the_interpolated_p99_meets_a_target_that_99_percent_within_misses_and_vice_versa() -> None:
    """Read with an edge at 300 ms: 98.8% within misses 99% although the P99 interpolated inside vLLM's (250, 500]
    bucket sits under 300 ms; and 99.2% within meets it although the interpolated P99 sits over."""
    slo_p99 = SLOSpec.model_validate({"ttft": {"p99": 300}})
    slo_att = SLOSpec.model_validate({"ttft": {"p99": 300}, "attainment": 0.99})
    missing = _skewed(988, 12, 310.0)  # 98.8% within 300 ms; the slow ones just above it
    by_vllm = LatencySummary.from_histogram(_histogram(missing, VLLM_TTFT_S))
    with_edge = LatencySummary.from_histogram(_histogram(missing, (*VLLM_TTFT_S, 0.3)))
    assert by_vllm.p99_ms is not None and by_vllm.p99_ms < 300  # interpolation calls it met
    assert slo_p99.is_met(_window(by_vllm)) and not slo_att.is_met(_window(with_edge))
    meeting = np.concatenate([_skewed(900, 92, 260.0), np.full(8, 450.0)])  # 99.2% within, 100 in the bucket
    by_vllm = LatencySummary.from_histogram(_histogram(meeting, VLLM_TTFT_S))
    with_edge = LatencySummary.from_histogram(_histogram(meeting, (*VLLM_TTFT_S, 0.3)))
    assert by_vllm.p99_ms is not None and by_vllm.p99_ms > 300  # interpolation calls it missed
    assert not slo_p99.is_met(_window(by_vllm)) and slo_att.is_met(_window(with_edge))


def test_the_exact_binomial_bound_on_the_share_agrees_with_the_order_statistic_bound() -> None:
    """Clopper-Pearson's lower bound reaches a share exactly when the order-statistic bound of that quantile is
    under the target: one verdict, read from counts."""
    for n in (50, 161, 400):
        for share in (0.9, 0.99):
            k = order_statistic_rank(n, share * 100)
            for within in range(n + 1):
                assert (share_lower_bound(within, n) >= share) == (k is not None and within >= k)


def test_bounds_judge_the_share_over_pooled_windows() -> None:
    slo = SLOSpec.model_validate({"ttft": {"p99": 300}, "attainment": 0.99})
    rng = np.random.default_rng(0)
    good = [_window(LatencySummary.from_samples(rng.uniform(10, 200, 400))) for _ in range(2)]
    (bound,) = bounds(slo, good)
    assert bound.holds and bound.attainment is not None and bound.attainment.lower > 0.99
    assert "100.00% within" in bound.describe()
    short = [_window(LatencySummary.from_samples(np.concatenate([rng.uniform(10, 200, 396), [400.0] * 4])))
             for _ in range(2)]  # 99.0% within: a point estimate at the line, its bound under it
    (bound,) = bounds(slo, short)
    assert slo.is_met(short[0]) and not bound.holds and bound.attainment is not None
    assert bound.attainment.lower < 0.99


def test_status_rows_and_the_diagnosis_state_the_bracket_of_vllms_buckets() -> None:
    slo = SLOSpec.model_validate({"ttft": {"p99": 300}, "attainment": 0.99})
    window = _window(LatencySummary.from_histogram(_histogram(_skewed(985, 15, 310.0), VLLM_TTFT_S)))
    (row,) = observed(slo, window).attainment
    assert row.target == "ttft_p99" and row.required == 0.99 and not row.exact
    assert row.low == pytest.approx(0.985) and row.high == 1.0 and row.lower_bound is not None
    (line,) = interpolation_evidence(slo, window)
    assert "(250, 500] ms" in line and "98.5%" in line and "100.0%" in line


def test_a_target_missed_by_attainment_alone_reaches_the_policy_as_a_missed_percentile() -> None:
    slo = SLOSpec.model_validate({"ttft": {"p99": 300}, "attainment": 0.999})
    window = _window(LatencySummary.from_samples(_skewed(995, 5, 400.0)))  # P99 ~ 90 ms, 99.5% within
    assert not slo.is_met(window)
    decided = as_percentiles(slo, window)
    assert decided.ttft is not None and decided.ttft.p99 is not None
    assert (window.ttft.p99_ms or 0) > decided.ttft.p99  # the percentile now misses: the policy acts on it


def test_extrapolated_prometheus_counts_never_make_a_share_above_one() -> None:
    """increase() extrapolates to the window's edges: 10.1 requests, all within, is a share of 1, not 101%."""
    slo = SLOSpec.model_validate({"ttft": {"p99": 400}, "attainment": 0.9})
    window = _window(LatencySummary.from_histogram(Histogram((0.1, 0.4, float("inf")), (5.4, 4.7, 0.0))))
    found = attained(window.ttft, 400.0)
    assert found is not None and found.fraction == 1.0 and slo.is_met(window)
    (row,) = observed(slo, window).attainment
    assert row.attained == 1.0 and row.lower_bound is not None and 0 < row.lower_bound < 1
    (bound,) = bounds(slo, [window, window])
    assert bound.attainment is not None and bound.attainment.lower <= 1.0
