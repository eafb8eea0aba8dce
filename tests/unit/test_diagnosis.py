"""Diagnosis: one test per bottleneck rule (DESIGN.md workflow step 2), on windows built with known breakdowns."""

from __future__ import annotations

import numpy as np

from slotune.knobs import RuntimeConfig
from slotune.perfmodel import Deployment
from slotune.policy.diagnosis import Bottleneck, diagnose
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.snapshot import LatencySummary, MetricsSnapshot, Source
from slotune.workload import Profile, WorkloadSpec

H100 = Deployment.from_names("llama-3.1-8b", "h100")
L4 = Deployment.from_names("llama-3.1-8b", "l4")
SLO = SLOSpec.model_validate({"ttft": {"p99": 1000}, "tpot": {"p50": 50, "p99": 100}})


def _around(center_ms: float, spread: float = 0.1, n: int = 200, tail_ms: float | None = None) -> LatencySummary:
    values = np.random.default_rng(0).normal(center_ms, center_ms * spread, n).clip(0.1)
    if tail_ms is not None:
        values[: n // 20] = tail_ms  # 5% slow requests make the p99
    return LatencySummary.from_samples(values)


def _window(ttft: float, queue: float, prefill: float, tpot: float, tpot_tail: float | None = None,
            **extra: object) -> MetricsSnapshot:
    fields = {"num_running_mean": 8.0, "num_waiting_mean": 0.0, "kv_cache_usage": 0.3, "mean_prompt_tokens": 1000.0,
              "mean_generation_tokens": 150.0, "request_rate_per_s": 4.0} | extra
    return MetricsSnapshot(source=Source.CLIENT, window_s=60, num_requests=200, ttft=_around(ttft),
                           queue=_around(queue), prefill=_around(prefill), tpot=_around(tpot, tail_ms=tpot_tail),
                           **fields)  # type: ignore[arg-type]


def test_slo_met_is_no_bottleneck_with_evidence_per_target():
    d = diagnose(_window(300, 20, 280, 20), RuntimeConfig(), SLO, H100)
    assert d.bottleneck is Bottleneck.NONE
    assert d.violated == ()
    assert len(d.evidence) == len(SLO.targets())


def test_queue_dominating_ttft_is_capacity():
    d = diagnose(_window(3000, 2800, 200, 20, num_running_mean=4.0, num_waiting_mean=30.0),
                 RuntimeConfig(max_num_seqs=4), SLO, H100)
    assert d.bottleneck is Bottleneck.CAPACITY
    assert any("4.0 of max_num_seqs 4" in line for line in d.evidence)
    assert d.primary is not None and d.primary.target.name == "ttft_p99"


def test_prefill_dominating_with_shared_prefixes_and_cache_off_is_prefix_cache():
    workload = WorkloadSpec(profile=Profile.PREFIX_HEAVY, request_rate_per_s=4)
    d = diagnose(_window(1500, 100, 1400, 20), RuntimeConfig(enable_prefix_caching=False), SLO, H100, workload)
    assert d.bottleneck is Bottleneck.PREFIX_CACHE
    assert any("prefix caching is off" in line for line in d.evidence)


def test_prefix_cache_on_but_missing_is_still_prefix_cache():
    workload = WorkloadSpec(profile=Profile.PREFIX_HEAVY, request_rate_per_s=4)
    d = diagnose(_window(1500, 100, 1400, 20, prefix_cache_hit_rate=0.05), RuntimeConfig(), SLO, H100, workload)
    assert d.bottleneck is Bottleneck.PREFIX_CACHE
    assert any("hit rate 5%" in line for line in d.evidence)


def test_prefill_dominating_without_shared_prefixes_is_prefill():
    d = diagnose(_window(1500, 100, 1400, 20), RuntimeConfig(max_num_batched_tokens=256), SLO, H100)
    assert d.bottleneck is Bottleneck.PREFILL
    assert any("token budget 256" in line for line in d.evidence)


def test_tpot_tail_with_fine_median_is_prefill_interference():
    d = diagnose(_window(300, 20, 280, 30, tpot_tail=400), RuntimeConfig(enable_chunked_prefill=False), SLO, H100)
    assert d.bottleneck is Bottleneck.PREFILL_INTERFERENCE


def test_tpot_high_throughout_is_decode_bandwidth():
    d = diagnose(_window(300, 20, 280, 80, num_running_mean=200.0), RuntimeConfig(), SLO, H100)
    assert d.bottleneck is Bottleneck.DECODE_BANDWIDTH
    assert d.out_of_reach == ()  # an H100 streams 8B weights in ~6 ms: 50 ms is reachable
    assert any("running 200.0 sequences" in line for line in d.evidence)


def test_a_tpot_target_below_the_roofline_floor_is_out_of_reach():
    # 8B bf16 weights on an L4 need ~50-66 ms per token at batch 1 (docs/facts.md#gpu): 30 ms cannot be met.
    tight = SLOSpec.model_validate({"tpot": {"p99": 30}})
    d = diagnose(_window(300, 20, 280, 70), RuntimeConfig(), tight, L4)
    assert d.bottleneck is Bottleneck.DECODE_BANDWIDTH
    assert d.out_of_reach == ("tpot_p99",)
    assert d.floors.tpot_ms > 30
    same_on_h100 = diagnose(_window(300, 20, 280, 70), RuntimeConfig(), tight, H100)
    assert same_on_h100.out_of_reach == ()  # badly configured, not physically out of reach


def test_simulated_overload_is_diagnosed_as_capacity_with_full_confidence():
    workload = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=20)
    config = RuntimeConfig(max_num_seqs=4)
    snapshot = simulate_workload(H100, config, workload, 200, seed=0).snapshot
    d = diagnose(snapshot, config, SLO, H100, workload)
    assert d.bottleneck is Bottleneck.CAPACITY
    assert d.confidence == 1.0
    report = d.report("raise max_num_seqs")
    assert report.bottleneck == "capacity" and report.suggestion == "raise max_num_seqs"
