"""Generated workloads follow the distributions they were asked for (KS tests), reproducibly per seed."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats

from slotune.workload import (
    Arrival,
    LengthDistribution,
    Profile,
    WorkloadSpec,
    interarrival_gaps_s,
    iter_requests,
    plan_requests,
)

KS_ALPHA = 0.01  # seeded draws: deterministic, and a wrong distribution gives p-values far below this


def _custom(**fields: object) -> WorkloadSpec:
    base = {"profile": "custom", "requestRatePerS": 5.0, "arrival": "poisson",
            "promptTokens": {"p50": 1000, "p99": 4000, "max": 10**7}, "outputTokens": {"p50": 200, "p99": 600}}
    return WorkloadSpec.model_validate(base | fields)


def test_prompt_lengths_follow_the_lognormal_through_p50_and_p99() -> None:
    spec = _custom()
    lengths = np.array([r.prompt_tokens for r in plan_requests(spec, num_requests=3000, seed=3)])
    result = stats.kstest(lengths, spec.prompt.cdf)
    assert result.pvalue > KS_ALPHA
    assert np.percentile(lengths, 50) == pytest.approx(1000, rel=0.08)
    assert np.percentile(lengths, 99) == pytest.approx(4000, rel=0.25)


def test_a_wrong_distribution_is_rejected_by_the_same_ks_test() -> None:
    lengths = np.array([r.prompt_tokens for r in plan_requests(_custom(), num_requests=3000, seed=3)])
    other = LengthDistribution(p50=1100, p99=4000)
    assert stats.kstest(lengths, other.cdf).pvalue < KS_ALPHA


def test_poisson_gaps_are_exponential_with_the_requested_rate() -> None:
    planned = plan_requests(_custom(requestRatePerS=4.0), num_requests=3000, seed=5)
    gaps = np.diff([0.0] + [r.arrival_s for r in planned])
    assert stats.kstest(gaps, stats.expon(scale=0.25).cdf).pvalue > KS_ALPHA


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_gaps_have_the_requested_mean_and_cv(cv: float) -> None:
    spec = _custom(arrival="gamma", arrivalCv=cv, requestRatePerS=2.0)
    # KS on the gaps themselves: differencing cumulative float arrival times loses gaps below ~1e-13 s (shape 1/16).
    gaps = interarrival_gaps_s(spec, np.random.default_rng(1), 4000)
    shape = 1 / cv**2
    assert stats.kstest(gaps, stats.gamma(a=shape, scale=0.5 / shape).cdf).pvalue > KS_ALPHA
    arrivals = [r.arrival_s for r in plan_requests(spec, num_requests=20000, seed=1)]
    planned_gaps = np.diff([0.0, *arrivals])
    assert planned_gaps.mean() == pytest.approx(0.5, rel=0.15)
    assert planned_gaps.std() / planned_gaps.mean() == pytest.approx(cv, rel=0.2)


def test_constant_and_concurrency_arrivals() -> None:
    constant = plan_requests(_custom(arrival="constant", requestRatePerS=10.0), num_requests=5)
    assert [r.arrival_s for r in constant] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    closed = plan_requests(_custom(arrival="concurrency", concurrency=4), num_requests=5)
    assert all(r.arrival_s == 0.0 for r in closed)
    with pytest.raises(ValueError, match="closed-loop"):
        plan_requests(_custom(arrival="concurrency", concurrency=4), duration_s=3.0)


def test_duration_plans_every_arrival_inside_the_window() -> None:
    planned = plan_requests(_custom(requestRatePerS=20.0), duration_s=50.0, seed=1)
    assert all(r.arrival_s <= 50.0 for r in planned)
    assert len(planned) == pytest.approx(1000, rel=0.1)  # Poisson: sd ~ sqrt(1000) ~ 3%


def test_bounds_clip_lengths() -> None:
    spec = _custom(promptTokens={"p50": 100, "p99": 5000, "min": 50, "max": 300})
    lengths = [r.prompt_tokens for r in plan_requests(spec, num_requests=2000)]
    assert min(lengths) == 50 and max(lengths) == 300


def test_same_seed_same_plan_and_streams_are_independent() -> None:
    spec = WorkloadSpec(profile=Profile.PREFIX_HEAVY, request_rate_per_s=3.0)
    assert plan_requests(spec, num_requests=200, seed=9) == plan_requests(spec, num_requests=200, seed=9)
    assert plan_requests(spec, num_requests=200, seed=9) != plan_requests(spec, num_requests=200, seed=10)
    faster = spec.model_copy(update={"request_rate_per_s": 30.0})
    lengths = [r.prompt_tokens for r in plan_requests(spec, num_requests=50)]
    assert lengths == [r.prompt_tokens for r in plan_requests(faster, num_requests=50)]


def test_prefix_groups_follow_share_and_group_count() -> None:
    spec = WorkloadSpec(profile=Profile.PREFIX_HEAVY, request_rate_per_s=3.0)
    planned = plan_requests(spec, num_requests=4000, seed=2)
    with_prefix = [r for r in planned if r.prefix_group is not None]
    share = len(with_prefix) / len(planned)
    assert stats.binomtest(len(with_prefix), len(planned), 0.9).pvalue > KS_ALPHA, share
    assert {r.prefix_group for r in with_prefix} == {0, 1, 2, 3}
    assert all(r.shared_prefix_tokens == 1024 < r.prompt_tokens for r in with_prefix)
    assert all(r.shared_prefix_tokens == 0 for r in planned if r.prefix_group is None)


def test_profiles_fill_defaults_from_the_traces_and_explicit_fields_win() -> None:
    code = WorkloadSpec.model_validate({"profile": "code", "requestRatePerS": 1})
    assert code.arrival == Arrival.GAMMA and code.arrival_cv == 13.2
    assert (code.prompt.p50, code.prompt.p99, code.output.p50, code.output.p99) == (1469, 7436, 13, 251)
    chat = WorkloadSpec.model_validate({"profile": "chat", "arrival": "poisson", "outputTokens": {"p50": 5, "p99": 9}})
    assert chat.arrival == Arrival.POISSON and chat.output.p50 == 5 and chat.prompt.p50 == 1020
    dumped = chat.model_dump(by_alias=True, mode="json")
    assert dumped["promptTokens"]["p99"] == 4142 and "requestRatePerS" in dumped
    assert WorkloadSpec.model_validate(dumped) == chat


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"profile": "custom"}, "promptTokens and outputTokens"),
        ({"arrival": "concurrency"}, "needs concurrency"),
        ({"sharedPrefixTokens": 512}, "must exceed sharedPrefixTokens"),
        ({"promptTokens": {"p50": 10, "p99": 5}}, "p99"),
        ({"requestRatePerS": 0}, "greater than 0"),
        ({"bogus": 1}, "Extra inputs"),
    ],
)
def test_invalid_specs_say_what_to_fix(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WorkloadSpec.model_validate(fields)


def test_rate_is_required_for_open_loop_plans() -> None:
    with pytest.raises(ValueError, match="requestRatePerS"):
        next(iter_requests(WorkloadSpec()))


def test_every_field_has_a_description() -> None:
    schema = WorkloadSpec.model_json_schema(by_alias=True)
    for model in [schema, *schema["$defs"].values()]:
        for name, prop in model.get("properties", {}).items():
            assert prop.get("description"), name
