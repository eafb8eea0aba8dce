"""Infeasible as soon as the evidence says so, and still improving what is in reach (issue 16, item 5)."""

from __future__ import annotations

from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel import Deployment
from slotune.policy import Infeasible, PolicyInput, Proposal, propose
from slotune.policy.best_effort import without_targets
from slotune.policy.diagnosis import diagnose
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric
from slotune.workload import Profile, WorkloadSpec

L4 = Deployment.from_names("llama-3.1-8b", "l4")
SLO = SLOSpec.model_validate({"ttft": {"p99": 3000}, "tpot": {"p99": 100}})
TUNING = TuningSpec(bounds=KnobBounds(max_replicas=4))
FLOOD = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=150)  # ~90 L4 replicas' worth of 8B chat


def _decide(config: RuntimeConfig, workload: WorkloadSpec, slo: SLOSpec = SLO) -> Proposal | Infeasible:
    snapshot = simulate_workload(L4, config, workload, 150, seed=0).snapshot
    given = PolicyInput(config, snapshot, slo, TUNING, L4, workload=workload)
    return propose(diagnose(snapshot, config, slo, L4, workload), given)


def test_an_overload_far_beyond_max_replicas_is_infeasible_once_every_replica_was_measured():
    first = _decide(RuntimeConfig(max_num_seqs=4), FLOOD)
    assert isinstance(first, Proposal) and first.config.replicas == 4  # the verifying step: every allowed replica
    then = _decide(first.config, FLOOD)
    assert isinstance(then, Infeasible), then
    assert "replicas" in then.reason and any("maxReplicas is 4" in need for need in then.needs)
    assert then.best_effort is not None and then.best_effort.knob is Knob.MAX_NUM_SEQS  # still serve what it can
    assert then.best_effort.config.max_num_seqs > 4


def test_with_tpot_out_of_reach_the_ttft_target_is_still_worked_on():
    """TPOT below every allowed config's floor; TTFT is queueing behind a batch limit of 4: best effort raises it."""
    slo = SLOSpec.model_validate({"ttft": {"p99": 3000}, "tpot": {"p99": 20}})
    busy = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=1.5)
    decision = _decide(RuntimeConfig(max_num_seqs=4), busy, slo)
    assert isinstance(decision, Infeasible) and "tpot_p99" in decision.reason
    assert decision.best_effort is not None and decision.best_effort.target_metric is LatencyMetric.TTFT
    assert decision.best_effort.reason.startswith("best effort")


def test_without_targets_drops_only_the_named_ones():
    slo = SLOSpec.model_validate({"ttft": {"p99": 3000}, "tpot": {"p50": 10, "p99": 20}})
    assert [t.name for t in without_targets(slo, ("tpot_p99",)).targets()] == ["ttft_p99", "tpot_p50"]
    assert without_targets(SLOSpec.model_validate({"tpot": {"p99": 20}}), ("tpot_p99",)) is None
