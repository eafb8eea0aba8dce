"""Floors per config and reachability (issue 16, items 1-3): precision and speculation move the floor, the median
decides between interference and decode speed, measured acceptance drives the speculation gate, the floor and the
sizing; draft_model speculation needs a draft checkpoint (issue 20)."""

from __future__ import annotations

import pytest

from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.judge.verification import verify
from slotune.knobs import RuntimeConfig, SpeculativeConfig, SpeculativeMethod
from slotune.perfmodel import Deployment, capacity
from slotune.perfmodel.floors import expected_tokens_per_step, per_token_acceptance
from slotune.policy import Infeasible, PolicyInput, Proposal, propose
from slotune.policy.diagnosis import Bottleneck, diagnose
from slotune.policy.moves import speculate
from slotune.policy.remedies import remedies_for
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, LatencySummary, MetricsSnapshot, Source
from slotune.workload import Profile, WorkloadSpec

H100 = Deployment.from_names("llama-3.1-8b", "h100")
L4 = Deployment.from_names("llama-3.1-8b", "l4")
LIGHT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=0.3)
FAST = SLOSpec.model_validate({"tpot": {"p99": 5}})  # below an H100's plain 8B decode (~6.6 ms), not speculation's
TUNING = TuningSpec(bounds=KnobBounds(max_replicas=4))


def _ngram(k: int = 4) -> dict[str, object]:
    return SpeculativeConfig(method=SpeculativeMethod.NGRAM, num_speculative_tokens=k).model_dump()


def _given(deployment: Deployment, config: RuntimeConfig, slo: SLOSpec, tuning: TuningSpec = TUNING,
           acceptance: float = 0.5, measured: float | None = None, workload: WorkloadSpec = LIGHT,
           **fields: object) -> PolicyInput:
    snapshot = simulate_workload(deployment, config, workload, 120, seed=0, spec_acceptance_rate=acceptance).snapshot
    return PolicyInput(config, snapshot, slo, tuning, deployment, workload=workload, spec_acceptance=measured,
                       **fields)  # type: ignore[arg-type]


def _decide(given: PolicyInput) -> Proposal | Infeasible:
    diagnosis = diagnose(given.snapshot, given.config, given.slo, given.deployment, given.workload)
    return propose(diagnosis, given)


def _tpot_window(p50_ms: float, p99_ms: float) -> MetricsSnapshot:
    tpot = LatencySummary(p50_ms=p50_ms, p95_ms=p99_ms * 0.9, p99_ms=p99_ms, mean_ms=p50_ms, count=300)
    return MetricsSnapshot(Source.SIMULATOR, 60.0, 300, tpot=tpot, itl=tpot, request_rate_per_s=0.3,
                           mean_prompt_tokens=1000, mean_generation_tokens=150, num_running_mean=1.0)


# -- item 2: the median and the tail together ------------------------------------------------------------------------

def test_a_median_already_over_the_target_is_decode_speed_not_interference():
    """p99/p50 = 1.6 with the median twice the target: shorter prefill chunks cannot help; today's rule called it
    prefill interference, whose remedies hold neither speculation nor 8-bit weights."""
    slo = SLOSpec.model_validate({"tpot": {"p99": 30}})
    d = diagnose(_tpot_window(60, 96), RuntimeConfig(), slo, L4)
    assert d.bottleneck is Bottleneck.DECODE_BANDWIDTH
    tail_only = diagnose(_tpot_window(20, 40), RuntimeConfig(), slo, L4)
    assert tail_only.bottleneck is Bottleneck.PREFILL_INTERFERENCE  # the median within the target: a tail problem


def test_every_bottleneck_s_remedies_consider_the_knobs_that_lower_the_floor():
    """Interference (median fine, tail over the target) still lists speculation where TPOT is violated."""
    slo = SLOSpec.model_validate({"tpot": {"p99": 30}})
    config = RuntimeConfig(max_num_seqs=8)
    given = PolicyInput(config, _tpot_window(20, 40), slo, TUNING, H100, workload=LIGHT)
    d = diagnose(given.snapshot, config, slo, H100, LIGHT, TUNING)
    assert d.bottleneck is Bottleneck.PREFILL_INTERFERENCE
    assert Knob.SPECULATIVE in {r.knob for r in remedies_for(d, given)}


# -- item 1: floors per config ----------------------------------------------------------------------------------------

def test_a_target_below_the_plain_floor_but_within_speculation_s_reach_is_not_infeasible():
    decision = _decide(_given(H100, RuntimeConfig(), FAST))
    assert isinstance(decision, Proposal), decision
    assert decision.knob is Knob.SPECULATIVE


def test_the_floor_of_a_speculating_config_includes_speculation():
    """After speculation was kept, the target is judged against the speculating config's floor, not the plain one."""
    config = RuntimeConfig(speculative=_ngram(4))
    given = _given(H100, config, FAST, acceptance=0.8)
    d = diagnose(given.snapshot, config, FAST, H100, LIGHT)
    plain = diagnose(given.snapshot, RuntimeConfig(), FAST, H100, LIGHT)
    assert d.floors.tpot_ms < 5 < plain.floors.tpot_ms
    assert d.out_of_reach == ()


def test_the_replica_step_stays_once_speculation_brought_the_floor_under_the_target():
    config = RuntimeConfig(speculative=_ngram(4), max_num_seqs=8)
    busy = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=30)
    given = _given(H100, config, SLOSpec.model_validate({"ttft": {"p99": 3000}, "tpot": {"p99": 6}}),
                   acceptance=0.8, workload=busy)
    d = diagnose(given.snapshot, config, given.slo, H100, busy, TUNING)
    assert d.out_of_reach == ()
    assert Knob.REPLICAS in {r.knob for r in remedies_for(d, given)}


def test_infeasible_only_when_no_allowed_combination_has_a_floor_under_the_target():
    impossible = SLOSpec.model_validate({"tpot": {"p99": 1}})
    decision = _decide(_given(H100, RuntimeConfig(), impossible))
    assert isinstance(decision, Infeasible)
    assert "any allowed config" in decision.reason
    speculation_only = SLOSpec.model_validate({"tpot": {"p99": 5}})
    no_speculation = TuningSpec(bounds=KnobBounds(max_replicas=4), knobs=[Knob.MAX_NUM_SEQS, Knob.REPLICAS])
    assert isinstance(_decide(_given(H100, RuntimeConfig(), speculation_only, no_speculation)), Infeasible)


def test_8_bit_weights_count_toward_the_reachable_floor_only_with_quality_opt_in():
    slo = SLOSpec.model_validate({"tpot": {"p99": 45}})  # L4: plain ~70 ms, fp8 ~37 ms
    no_spec = [Knob.MAX_NUM_SEQS, Knob.REPLICAS]
    assert isinstance(_decide(_given(L4, RuntimeConfig(), slo, TuningSpec(knobs=no_spec))), Infeasible)
    opted = TuningSpec(knobs=[*no_spec, Knob.QUANTIZATION], allow_quality_change=True)
    decision = _decide(_given(L4, RuntimeConfig(), slo, opted))
    assert isinstance(decision, Proposal) and decision.knob is Knob.QUANTIZATION


# -- item 3: measured acceptance ---------------------------------------------------------------------------------------

def test_the_runtime_s_acceptance_rate_inverts_to_per_token_acceptance():
    for a in (0.1, 0.5, 0.9):
        k = 4
        rate = sum(a ** i for i in range(1, k + 1)) / k  # accepted / drafted, as the simulator and vLLM report
        assert per_token_acceptance(rate, k) == pytest.approx(a, abs=1e-3)
    assert expected_tokens_per_step(0.0, 4) == pytest.approx(1.0)


def test_the_speculation_gate_uses_the_measured_acceptance():
    low = speculate(_given(H100, RuntimeConfig(), FAST, measured=0.05), 1.0)
    assert low is None  # drafts almost never accepted: verifying them costs more than it yields
    prior = speculate(_given(H100, RuntimeConfig(), FAST), 1.0)
    high = speculate(_given(H100, RuntimeConfig(), FAST, measured=0.9), 1.0)
    assert prior is not None and high is not None
    assert "measured acceptance 0.90" in high.why and "prior" in prior.why


def test_the_floor_uses_the_measured_acceptance():
    given = _given(H100, RuntimeConfig(), FAST)
    low = diagnose(given.snapshot, RuntimeConfig(), FAST, H100, LIGHT, TUNING, acceptance=0.1)
    high = diagnose(given.snapshot, RuntimeConfig(), FAST, H100, LIGHT, TUNING, acceptance=0.9)
    assert high.floors.reachable_tpot_ms < 5 < low.floors.reachable_tpot_ms
    assert low.out_of_reach == ("tpot_p99",) and high.out_of_reach == ()


def test_sizing_uses_the_measured_acceptance():
    config = RuntimeConfig(speculative=_ngram(4), max_num_seqs=8)
    load = capacity.Load(4.0, 1000, 150, 0.0, spec_acceptance=0.1)
    high = capacity.Load(4.0, 1000, 150, 0.0, spec_acceptance=0.9)
    assert capacity.service_s(H100, config, high, None) < capacity.service_s(H100, config, load, None)


def test_speculation_whose_measured_acceptance_makes_it_a_loss_is_turned_off_and_says_why():
    config = RuntimeConfig(speculative=_ngram(8), max_num_seqs=256)
    busy = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=60)
    slo = SLOSpec.model_validate({"tpot": {"p99": 8}})
    given = _given(H100, config, slo, acceptance=0.05, workload=busy,
                   excluded_keys=frozenset({config.with_changes(speculative=None).key()}))
    decision = _decide(given)
    assert isinstance(decision, Proposal), decision
    assert decision.config.speculative is None and "loss" in decision.reason


# -- issue 20: draft_model speculation ---------------------------------------------------------------------------

def test_draft_model_speculation_only_with_a_draft_checkpoint():
    draft_only = TuningSpec(bounds=KnobBounds(max_replicas=4, speculative_methods=[SpeculativeMethod.DRAFT_MODEL]))
    without = _decide(_given(H100, RuntimeConfig(), FAST, draft_only))  # used to raise a ValidationError
    assert isinstance(without, Infeasible) or without.knob is not Knob.SPECULATIVE
    with_draft = _decide(_given(H100, RuntimeConfig(), FAST, draft_only, draft_model="hf://org/draft-1b"))
    assert isinstance(with_draft, Proposal) and with_draft.config.speculative is not None
    assert with_draft.config.speculative.method is SpeculativeMethod.DRAFT_MODEL
    assert with_draft.config.speculative.draft_model == "hf://org/draft-1b"


def test_a_validation_error_inside_the_policy_never_escapes(monkeypatch: pytest.MonkeyPatch):
    def broken(*_: object) -> list[object]:
        RuntimeConfig(max_num_seqs=0)  # raises pydantic's ValidationError, as an invalid remedy would
        return []

    monkeypatch.setattr("slotune.policy.remedies_for", broken)
    decision = _decide(_given(H100, RuntimeConfig(), FAST))
    assert isinstance(decision, Infeasible)


def test_a_speculation_change_rolled_back_records_the_acceptance_it_measured():
    busy = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=60)
    slo = SLOSpec.model_validate({"tpot": {"p99": 8}})
    plain = RuntimeConfig(max_num_seqs=256)
    before = simulate_workload(H100, plain, busy, 150, seed=0).snapshot
    after = simulate_workload(H100, plain.with_changes(speculative=_ngram(8)), busy, 150, seed=1,
                              spec_acceptance_rate=0.05).snapshot
    verdict = verify(before, after, LatencyMetric.TPOT, 99, slo)
    assert not verdict.keep and "measured draft acceptance 0.01" in verdict.reason
