"""Least invasive first (policy.risk): queueing is answered with batching, not 8-bit weights, and a kept
output-altering change is offered back once the SLO holds.

`slotune tune examples/local-smollm2.yaml` on a 2-core CPU made 8-bit weights its first change (queueing: 0.9 of 1
running, 5 waiting, TTFT P99 36.7 s against 10 s, TPOT P99 77 ms against 600 ms), kept for x1.11; max_num_seqs
1 -> 16 then met the SLO (x9), and it converged with int8 on.
"""

from __future__ import annotations

from dataclasses import replace

from slotune.api.tuning import Knob, KnobBounds, MaxNumSeqsRange, TuningSpec
from slotune.knobs import RuntimeConfig, SpeculativeConfig, SpeculativeMethod
from slotune.knobs.schema import Quantization
from slotune.perfmodel import Deployment
from slotune.policy import PolicyInput, Proposal, propose, propose_trim
from slotune.policy.diagnosis import Bottleneck, diagnose
from slotune.policy.risk import Risk, risk_of
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.snapshot import LatencySummary, MetricsSnapshot
from slotune.workload import Profile, WorkloadSpec

CPU = Deployment.from_names("small", "cpu")
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=0.5)
SLO = SLOSpec.model_validate({"ttft": {"p99": 10_000}, "tpot": {"p99": 600}})
KNOBS = [Knob.MAX_NUM_SEQS, Knob.MAX_NUM_BATCHED_TOKENS, Knob.ENABLE_CHUNKED_PREFILL, Knob.ENABLE_PREFIX_CACHING,
         Knob.SPECULATIVE, Knob.QUANTIZATION]
TUNING = TuningSpec(knobs=KNOBS, allow_quality_change=True,
                    bounds=KnobBounds(max_num_seqs=MaxNumSeqsRange(min=1, max=16)))
ONE_AT_A_TIME = RuntimeConfig(max_num_seqs=1, max_num_batched_tokens=256, enable_prefix_caching=True)


def _summary(p50_ms: float, p99_ms: float) -> LatencySummary:
    return LatencySummary(p50_ms=p50_ms, p95_ms=(p50_ms + p99_ms) / 2, p99_ms=p99_ms, count=40)


def _queued(config: RuntimeConfig) -> MetricsSnapshot:
    """The SmolLM2 run's first window: the queue makes TTFT, TPOT far under its target, the KV cache nearly empty."""
    base = simulate_workload(CPU, config, CHAT, 40, seed=0).snapshot
    return replace(base, ttft=_summary(20_000, 36_700), queue=_summary(19_000, 35_000), tpot=_summary(60, 77),
                   num_running_mean=0.9, num_waiting_mean=5.0, kv_cache_usage=0.05, num_preemptions=0.0)


def test_queueing_is_answered_with_batching_before_8_bit_weights():
    window = _queued(ONE_AT_A_TIME)
    diagnosis = diagnose(window, ONE_AT_A_TIME, SLO, CPU, CHAT, TUNING)
    assert diagnosis.bottleneck is Bottleneck.CAPACITY
    decision = propose(diagnosis, PolicyInput(ONE_AT_A_TIME, window, SLO, TUNING, CPU, workload=CHAT))
    assert isinstance(decision, Proposal), decision
    assert risk_of(ONE_AT_A_TIME, decision.config) is Risk.PLAIN, decision
    assert decision.knob is Knob.MAX_NUM_SEQS


def test_a_kept_output_altering_change_is_offered_back_once_the_slo_holds():
    int8 = ONE_AT_A_TIME.with_changes(max_num_seqs=16, quantization=Quantization.INT8)
    met = simulate_workload(CPU, int8, CHAT, 40, seed=1).snapshot
    trim = propose_trim(PolicyInput(int8, met, SLO, TUNING, CPU, workload=CHAT, excluded_keys=frozenset()))
    assert trim is not None and trim.trim
    assert trim.knob is Knob.QUANTIZATION and trim.config.quantization is Quantization.NONE
    assert trim.config.max_num_seqs == 16


NGRAM = ONE_AT_A_TIME.with_changes(max_num_seqs=16, speculative=SpeculativeConfig(method=SpeculativeMethod.NGRAM))


def test_speculation_is_offered_back_where_the_model_predicts_tpot_holds_without_it():
    # The tuner benchmark's chunking-off scenarios: chunked prefill alone met the SLO, speculation stayed on for good.
    met = replace(simulate_workload(CPU, NGRAM, CHAT, 40, seed=1).snapshot, tpot=_summary(40, 60))
    trim = propose_trim(PolicyInput(NGRAM, met, SLO, TUNING, CPU, workload=CHAT, excluded_keys=frozenset()))
    assert trim is not None and trim.trim
    assert trim.knob is Knob.SPECULATIVE and trim.config.speculative is None
    assert trim.config.max_num_seqs == 16


def test_speculation_is_kept_where_the_model_predicts_tpot_needs_it():
    # TPOT at 90% of its target with speculation: decoding a token a step is predicted to break it, and trying
    # would cost users a missed window for nothing.
    tight = replace(simulate_workload(CPU, NGRAM, CHAT, 40, seed=1).snapshot, tpot=_summary(500, 540))
    trim = propose_trim(PolicyInput(NGRAM, tight, SLO, TUNING, CPU, workload=CHAT, excluded_keys=frozenset()))
    assert trim is None or trim.knob is not Knob.SPECULATIVE, trim
