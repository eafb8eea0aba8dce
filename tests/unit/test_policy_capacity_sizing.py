"""The sized capacity change: where the load needs more replicas and the batch limit binds too, one change sets the
batch the model allows and the replicas the load needs at that batch, instead of every allowed replica first (sized
for the small batch), the batch next and trims after (issue 16: fewer configs to the SLO than the search baselines)."""

from __future__ import annotations

from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel import Deployment
from slotune.policy import PolicyInput, Proposal, propose
from slotune.policy.diagnosis import diagnose
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.workload import Profile, WorkloadSpec

H100 = Deployment.from_names("llama-3.1-8b", "h100")
RELAXED = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
HEAVY = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=80)
START = RuntimeConfig(max_num_seqs=4, max_num_batched_tokens=512, replicas=1)


def _propose(tuning: TuningSpec, excluded: frozenset[str] = frozenset(), rolled_back: tuple[str, ...] = ()):
    snapshot = simulate_workload(H100, START, HEAVY, 150, seed=0).snapshot
    diagnosis = diagnose(snapshot, START, RELAXED, H100, HEAVY)
    return propose(diagnosis, PolicyInput(START, snapshot, RELAXED, tuning, H100, excluded, rolled_back,
                                          workload=HEAVY))


def test_a_load_that_needs_replicas_and_batch_gets_both_in_one_sized_change():
    decision = _propose(TuningSpec(bounds=KnobBounds(max_replicas=4)))
    assert isinstance(decision, Proposal) and decision.knob is Knob.REPLICAS
    assert START.changed_knobs(decision.config) == {"max_num_seqs", "replicas"}
    assert decision.config.max_num_seqs >= 32 and 1 < decision.config.replicas <= 4
    assert "replicas at that batch" in decision.reason


def test_rolled_back_or_not_allowed_the_single_knob_steps_remain():
    sized = _propose(TuningSpec(bounds=KnobBounds(max_replicas=4)))
    assert isinstance(sized, Proposal)
    after = _propose(TuningSpec(bounds=KnobBounds(max_replicas=4)), frozenset({sized.config.key()}))
    assert isinstance(after, Proposal) and len(START.changed_knobs(after.config)) == 1
    replicas_only = TuningSpec(bounds=KnobBounds(max_replicas=4), knobs=[Knob.REPLICAS])
    single = _propose(replicas_only)
    assert isinstance(single, Proposal) and START.changed_knobs(single.config) == {"replicas"}


def test_a_window_that_only_just_missed_gets_one_replica_more_not_the_model_s_count():
    # 2 replicas of prefix-heavy chat at 80 requests/s on an H100 meet TTFT P99 500 ms in half the windows; this
    # one reads ~800 ms (1.6x). The capacity model, which errs up to 2x high, asks for 4; 3 is what holds.
    from slotune.tunerbench.evaluator import Evaluator
    from slotune.tunerbench.scenario import Scenario

    scenario = Scenario.model_validate({
        "name": "prefix-heavy", "model": "llama-3.1-8b", "accelerator": "nvidia-h100-80gb",
        "workload": {"profile": "prefix-heavy", "requestRatePerS": 80},
        "slo": {"ttft": {"p99": 500}, "tpot": {"p99": 30}}, "start": {"maxNumSeqs": 16, "replicas": 1},
        "tuning": {"bounds": {"maxReplicas": 4}}})
    config = RuntimeConfig(max_num_seqs=128, max_num_batched_tokens=1024, enable_prefix_caching=True, replicas=2)
    snapshot = Evaluator(scenario).window(config, 3)
    assert snapshot is not None and 1.3 < (snapshot.ttft.p99_ms or 0) / 500 < 2.0
    deployment, workload, slo = scenario.deployment, scenario.workload, scenario.slo
    given = PolicyInput(config, snapshot, slo, scenario.tuning, deployment, frozenset(), workload=workload)
    decision = propose(diagnose(snapshot, config, slo, deployment, workload), given)
    assert isinstance(decision, Proposal) and config.changed_knobs(decision.config) == {"replicas"}
    assert decision.config.replicas == 3



def test_the_sized_capacity_change_never_carries_8bit_weights():
    """8-bit weights alter outputs: a change of their own (attributed, and judged by the quality gate alone), never
    part of a capacity change, even on a low-bandwidth part where the spec allows them."""
    l4 = Deployment.from_names("llama-3.1-8b", "l4")
    load = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=12)
    tuning = TuningSpec(allow_quality_change=True, bounds=KnobBounds(max_replicas=8),
                        knobs=[Knob.MAX_NUM_SEQS, Knob.REPLICAS, Knob.QUANTIZATION])
    config, sized = START, 0
    for _ in range(4):
        snapshot = simulate_workload(l4, config, load, 150, seed=0).snapshot
        diagnosis = diagnose(snapshot, config, RELAXED, l4, load)
        if diagnosis.primary is None:
            break
        decision = propose(diagnosis, PolicyInput(config, snapshot, RELAXED, tuning, l4, frozenset(), workload=load))
        if not isinstance(decision, Proposal):
            break
        moved = config.changed_knobs(decision.config)
        assert "quantization" not in moved or moved == {"quantization"}, decision.reason
        sized += moved == {"max_num_seqs", "replicas"}
        config = decision.config
    assert sized, "the load never called for a sized capacity change: the test proves nothing"
