"""policy.infeasible_evidence: what one window alone says about feasibility, the point from which the tuner bench
counts the changes to an Infeasible verdict (issue 16: within 2 changes of the evidence)."""

from __future__ import annotations

from slotune.api.tuning import KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel import Deployment
from slotune.policy import PolicyInput, infeasible_evidence
from slotune.policy.diagnosis import diagnose
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.workload import Profile, WorkloadSpec

L4 = Deployment.from_names("llama-3.1-8b", "l4")
H100 = Deployment.from_names("llama-3.1-8b", "h100")
TUNING = TuningSpec(bounds=KnobBounds(max_replicas=4))


def _evidence(deployment: Deployment, config: RuntimeConfig, workload: WorkloadSpec, slo: SLOSpec) -> str | None:
    snapshot = simulate_workload(deployment, config, workload, 150, seed=0).snapshot
    diagnosis = diagnose(snapshot, config, slo, deployment, workload)
    return infeasible_evidence(diagnosis, PolicyInput(config, snapshot, slo, TUNING, deployment, frozenset(),
                                                      workload=workload))


def test_an_overload_is_evidence_on_the_first_window_before_any_replica_was_added():
    # ~100 L4 replicas' worth of chat against maxReplicas 4, measured at 1 replica: the capacity model says so now;
    # propose() still waits for the verifying window at 4 replicas, the bench counts the changes from this one.
    overload = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=150)
    found = _evidence(L4, RuntimeConfig(max_num_seqs=4, replicas=1), overload,
                      SLOSpec.model_validate({"ttft": {"p99": 3000}, "tpot": {"p99": 100}}))
    assert found is not None and "replicas" in found and "maxReplicas 4" in found


def test_a_tpot_below_every_allowed_floor_is_evidence_and_a_reachable_slo_is_none():
    light = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=1)
    found = _evidence(L4, RuntimeConfig(max_num_seqs=8), light, SLOSpec.model_validate({"tpot": {"p99": 20}}))
    assert found is not None and "tpot_p99" in found
    busy = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=40)
    relaxed = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
    assert _evidence(H100, RuntimeConfig(max_num_seqs=4), busy, relaxed) is None  # more batch or replicas will do
