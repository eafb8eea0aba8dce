"""Client-side statistics: bootstrap CIs cover the truth, failures count as SLO violations, vLLM-style keys."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from slotune.loadgen.record import RequestRecord
from slotune.loadgen.stats import bootstrap_percentile, client_snapshot, summarize
from slotune.slo import SLOSpec
from slotune.snapshot import Source


def test_bootstrap_ci_covers_the_true_percentile_at_about_its_level() -> None:
    rng = np.random.default_rng(0)
    truth = float(stats.lognorm(s=0.5, scale=100).ppf(0.95))
    covered = 0
    for trial in range(200):
        estimate = bootstrap_percentile(rng.lognormal(np.log(100), 0.5, 500), 95, num_resamples=400, seed=trial)
        assert estimate is not None and estimate.low <= estimate.value <= estimate.high
        covered += estimate.low <= truth <= estimate.high
    assert 0.88 <= covered / 200 <= 0.99  # nominal 95%; the percentile bootstrap runs slightly short in the tail


def _record(index: int, ttft_s: float, e2e_s: float, output_tokens: int = 11, **fields: object) -> RequestRecord:
    return RequestRecord(index=index, url="u", sent_s=float(index), prompt_tokens=100, output_tokens=output_tokens,
                         ttft_s=ttft_s, e2e_s=e2e_s, itl_s=(0.01,) * (output_tokens - 1), **fields)


def test_summary_keys_and_values_follow_vllm_benchmark() -> None:
    records = [_record(i, ttft_s=0.1 + 0.001 * i, e2e_s=0.2 + 0.001 * i) for i in range(100)]
    out = summarize(records, duration_s=10.0).json()
    assert out["completed"] == 100 and out["request_throughput"] == 10.0 and out["output_throughput"] == 110.0
    assert out["median_ttft_ms"] == pytest.approx(149.5) and out["p99_ttft_ms"] == pytest.approx(198.01)
    assert out["mean_tpot_ms"] == pytest.approx(10.0)  # (e2e - ttft) / (11 - 1)
    low, high = out["p99_ttft_ci_ms"]
    assert low <= out["p99_ttft_ms"] <= high
    assert out["mean_e2el_ms"] == pytest.approx(249.5) and out["mean_itl_ms"] == pytest.approx(10.0)


def test_failures_and_rejections_are_violations_and_warmup_is_excluded() -> None:
    fast = [_record(i, ttft_s=0.05, e2e_s=0.2) for i in range(95)]
    rejected = [RequestRecord(index=95 + i, url="u", sent_s=0, prompt_tokens=100, output_tokens=0,
                              error="429 Too Many Requests", status_code=429) for i in range(3)]
    slow = [_record(98 + i, ttft_s=2.0, e2e_s=3.0) for i in range(2)]
    warmup = [_record(200 + i, ttft_s=9.0, e2e_s=9.0, warmup=True) for i in range(50)]
    slo = SLOSpec.model_validate({"ttft": {"p50": 100, "p99": 500}, "attainment": 0.9})
    summary = summarize([*warmup, *fast, *rejected, *slow], duration_s=10.0, slo=slo)
    out = summary.json()
    assert out["completed"] == 97 and out["failed"] == 3 and out["rejected"] == 3
    assert out["slo_attainment"] == pytest.approx(0.95) and out["request_goodput"] == pytest.approx(9.5)
    results = {r.name: r for r in summary.slo_results}
    assert results["ttft_p50"].met and results["ttft_p50"].observed_ms == pytest.approx(50.0)
    assert not results["ttft_p99"].met and results["ttft_p99"].observed_ms == np.inf  # the 3 failures
    assert out["slo_met"] is False


def test_client_snapshot_carries_samples_and_failures() -> None:
    records = [_record(i, ttft_s=0.1, e2e_s=0.3) for i in range(10)]
    records.append(RequestRecord(index=10, url="u", sent_s=0, prompt_tokens=5, output_tokens=0, error="reset"))
    snapshot = client_snapshot(records, duration_s=5.0)
    assert snapshot.source == Source.CLIENT and snapshot.num_requests == 10 and snapshot.num_failed_requests == 1
    assert snapshot.ttft.samples_ms is not None and len(snapshot.ttft.samples_ms) == 10
    assert snapshot.tpot.p50_ms == pytest.approx(20.0) and snapshot.generation_tokens_per_s == pytest.approx(22.0)
