"""Simulator: each knob moves the metric it should, and the snapshot looks like a real window."""

from __future__ import annotations

import pytest

from slotune.knobs import Quantization, RuntimeConfig, SpeculativeConfig, SpeculativeMethod
from slotune.perfmodel import accelerator, model_profile
from slotune.simulator import Deployment, simulate, simulate_workload
from slotune.snapshot import Source
from slotune.workload import LengthDistribution, PlannedRequest, Profile, WorkloadSpec, plan_requests

H100 = Deployment(model_profile("llama-3.1-8b"), accelerator("h100"))
L4 = Deployment(model_profile("llama-3.1-8b"), accelerator("l4"))
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=8)


def test_snapshot_is_a_simulator_window_with_samples_for_every_request():
    result = simulate_workload(H100, RuntimeConfig(), CHAT, num_requests=120, seed=3)
    snap = result.snapshot
    assert snap.source is Source.SIMULATOR
    assert snap.num_requests == 120 == len(result.records)
    assert snap.ttft.samples_ms is not None and len(snap.ttft.samples_ms) == 120
    assert snap.itl.histogram is not None and snap.itl.count > 0
    assert 0 < snap.ttft.p50_ms <= snap.ttft.p99_ms
    assert snap.generation_tokens_per_s > 0
    for record in result.records:
        assert record.arrival_s <= record.first_scheduled_s <= record.first_token_s <= record.finish_s


def test_same_seed_same_window_other_seed_other_window():
    a = simulate_workload(H100, RuntimeConfig(), CHAT, 80, seed=1).snapshot
    b = simulate_workload(H100, RuntimeConfig(), CHAT, 80, seed=1).snapshot
    c = simulate_workload(H100, RuntimeConfig(), CHAT, 80, seed=2).snapshot
    assert a.ttft.samples_ms == b.ttft.samples_ms
    assert a.ttft.samples_ms != c.ttft.samples_ms


def test_a_tiny_batch_limit_queues_requests_and_raising_it_removes_the_queue():
    tight = simulate_workload(H100, RuntimeConfig(max_num_seqs=2), CHAT, 150, seed=0).snapshot
    roomy = simulate_workload(H100, RuntimeConfig(max_num_seqs=128), CHAT, 150, seed=0).snapshot
    assert tight.queue.p99_ms > 10 * roomy.queue.p99_ms
    assert tight.num_running_mean == pytest.approx(2, abs=0.3)


def test_more_replicas_cut_queueing_under_overload():
    heavy = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=12)
    one = simulate_workload(L4, RuntimeConfig(max_num_seqs=32), heavy, 120, seed=0).snapshot
    three = simulate_workload(L4, RuntimeConfig(max_num_seqs=32, replicas=3), heavy, 120, seed=0).snapshot
    assert three.ttft.p99_ms < one.ttft.p99_ms / 2


def test_prefix_caching_hits_the_shared_share_and_cuts_prefill():
    workload = WorkloadSpec(profile=Profile.PREFIX_HEAVY, request_rate_per_s=2)
    off = simulate_workload(L4, RuntimeConfig(enable_prefix_caching=False), workload, 120, seed=0).snapshot
    on = simulate_workload(L4, RuntimeConfig(enable_prefix_caching=True), workload, 120, seed=0).snapshot
    assert off.prefix_cache_hit_rate == 0
    # 90% of prompts (mean ~1.9k tokens) share a 1024-token prefix: close to half of all prompt tokens can hit.
    assert 0.3 < on.prefix_cache_hit_rate < 0.6
    assert on.prefill.p50_ms < 0.7 * off.prefill.p50_ms


def test_chunked_prefill_cuts_the_inter_token_tail_under_long_prompts():
    workload = WorkloadSpec(profile=Profile.SUMMARIZATION, request_rate_per_s=3)
    whole = RuntimeConfig(enable_chunked_prefill=False, max_num_batched_tokens=16384)
    chunked = RuntimeConfig(enable_chunked_prefill=True, max_num_batched_tokens=512)
    a = simulate_workload(H100, whole, workload, 120, seed=0).snapshot
    b = simulate_workload(H100, chunked, workload, 120, seed=0).snapshot
    assert b.itl.p99_ms < 0.7 * a.itl.p99_ms


def test_speculation_helps_at_low_load_and_costs_more_per_step():
    light = WorkloadSpec(profile=Profile.SUMMARIZATION, request_rate_per_s=0.5)
    spec = RuntimeConfig(speculative=SpeculativeConfig(method=SpeculativeMethod.NGRAM, num_speculative_tokens=4))
    off = simulate_workload(L4, RuntimeConfig(), light, 60, seed=0, spec_acceptance_rate=0.7).snapshot
    on = simulate_workload(L4, spec, light, 60, seed=0, spec_acceptance_rate=0.7).snapshot
    assert on.tpot.p50_ms < 0.6 * off.tpot.p50_ms
    assert on.spec_mean_acceptance_length == pytest.approx(1 + 0.7 + 0.49 + 0.343 + 0.2401)
    # Verification is nearly free while decode is bandwidth bound, and not once the batch is compute bound.
    step = H100.step_model(RuntimeConfig())
    assert step.decode_step_s(1, 2000, tokens_per_seq=5) < 1.1 * step.decode_step_s(1, 2000)
    assert step.decode_step_s(256, 100, tokens_per_seq=5) > 2 * step.decode_step_s(256, 100)


def test_quantization_speeds_up_bandwidth_bound_decode():
    light = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=0.5)
    bf16 = simulate_workload(L4, RuntimeConfig(), light, 40, seed=0).snapshot
    int8 = simulate_workload(L4, RuntimeConfig(quantization=Quantization.INT8), light, 40, seed=0).snapshot
    assert int8.tpot.p50_ms < 0.65 * bf16.tpot.p50_ms


def test_kv_pressure_preempts_and_still_finishes_every_request():
    long_outputs = WorkloadSpec(profile=Profile.CUSTOM, request_rate_per_s=20,
                                prompt_tokens=LengthDistribution(p50=3000, p99=6000),
                                output_tokens=LengthDistribution(p50=800, p99=1500))
    result = simulate_workload(L4, RuntimeConfig(max_num_seqs=256, max_num_batched_tokens=8192), long_outputs, 60)
    assert result.snapshot.num_preemptions > 0
    assert result.snapshot.num_requests == 60
    assert result.snapshot.kv_cache_usage > 0.5


def test_a_request_larger_than_the_kv_cache_is_refused_not_hung():
    huge = PlannedRequest(arrival_s=0.0, prompt_tokens=10_000_000, output_tokens=5, prefix_group=None,
                          shared_prefix_tokens=0)
    normal = plan_requests(CHAT, num_requests=5, seed=0)
    result = simulate(H100, RuntimeConfig(), [huge, *normal])
    assert result.snapshot.num_failed_requests == 1
    assert result.snapshot.num_requests == 5


def _cpu_tiny(**host: float) -> Deployment:
    from slotune.perfmodel import Efficiency

    eff = Efficiency(bandwidth=0.6, compute=0.45, step_overhead_s=0.002, layer_overhead_s=0.0, **host)
    return Deployment(model_profile("tiny"), accelerator("cpu"), efficiency=eff)


def test_per_sequence_costs_make_tpot_grow_with_the_batch_as_an_eager_engine_does():
    requests = [PlannedRequest(0.0, 200, 48, None, 0) for _ in range(8)]
    host = _cpu_tiny(seq_overhead_s=4e-4, decode_context_token_s=1e-6)
    for deployment, grows in ((_cpu_tiny(), False), (host, True)):
        alone = simulate(deployment, RuntimeConfig(max_num_seqs=1), requests[:1]).snapshot.tpot.p50_ms
        batched = simulate(deployment, RuntimeConfig(max_num_seqs=8), requests).snapshot.tpot.p50_ms
        assert (batched > 1.5 * alone) is grows, (alone, batched)


def test_prefill_after_a_cached_prefix_pays_for_its_pairs_with_the_cached_context():
    requests = [PlannedRequest(i * 2.0, 600, 4, 0, 400) for i in range(4)]  # one group, far apart: every later hit
    config = RuntimeConfig(max_num_seqs=4, enable_prefix_caching=True)
    cheap = simulate(_cpu_tiny(), config, requests).records
    costly = simulate(_cpu_tiny(prefill_context_pair_s=1e-6), config, requests).records
    assert all(r.cached_tokens == 400 for r in cheap[1:])
    first_token_s = [(r.first_token_s - r.arrival_s) for r in cheap], [(r.first_token_s - r.arrival_s) for r in costly]
    assert first_token_s[1][0] == pytest.approx(first_token_s[0][0])  # a fresh prompt has no earlier context
    for cheap_s, costly_s in zip(first_token_s[0][1:], first_token_s[1][1:], strict=True):
        assert costly_s - cheap_s == pytest.approx(200 * 400 * 1e-6, rel=0.01)
