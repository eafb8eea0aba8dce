"""No prior decides a verdict: a TPOT target that speculation could reach at some acceptance the bounds allow is not
out of reach (so not Infeasible) until the workload's acceptance was measured.

A tuner-benchmark world with a TPOT target only speculation reaches, and drafts accepted far more often than the 0.5
prior, computed a floor "at draft acceptance 0.50" equal to the target and was declared Infeasible after 4 windows
without one change: speculation was never measured. Covered here: draft acceptance. Not yet: efficiency, prefix hit
rate and per-replica capacity priors."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel import Deployment
from slotune.policy import Infeasible, PolicyInput, Proposal, propose
from slotune.policy.diagnosis import diagnose
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.workload import Profile, WorkloadSpec

H100 = Deployment.from_names("llama-3.1-8b", "h100")
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=1)
TUNING = TuningSpec(knobs=[Knob.MAX_NUM_SEQS, Knob.SPECULATIVE, Knob.REPLICAS], bounds=KnobBounds(max_replicas=1))
CONFIG = RuntimeConfig(max_num_seqs=8)
WINDOW = simulate_workload(H100, CONFIG, CHAT, 60, seed=0).snapshot  # TPOT p99 ~7.6 ms; floor at a=0.5: 3.1 ms


def _slo(tpot_ms: float) -> SLOSpec:
    return SLOSpec.model_validate({"ttft": {"p99": 60_000}, "tpot": {"p99": tpot_ms}})


@settings(max_examples=25, deadline=None)
@given(tpot_ms=st.floats(0.75, 5.0))
def test_an_unmeasured_acceptance_never_puts_a_target_out_of_reach(tpot_ms: float) -> None:
    diagnosis = diagnose(WINDOW, CONFIG, _slo(tpot_ms), H100, CHAT, TUNING, acceptance=None)
    assert not diagnosis.out_of_reach, diagnosis.evidence


def test_speculation_is_measured_before_infeasible():
    slo = _slo(2.5)  # below the floor at the 0.5 prior (3.1 ms), above the one at full acceptance (0.7 ms)
    decision = propose(diagnose(WINDOW, CONFIG, slo, H100, CHAT, TUNING),
                       PolicyInput(CONFIG, WINDOW, slo, TUNING, H100, workload=CHAT))
    assert isinstance(decision, Proposal) and decision.knob is Knob.SPECULATIVE, decision


def test_a_measured_low_acceptance_does_put_it_out_of_reach():
    slo = _slo(2.5)
    diagnosis = diagnose(WINDOW, CONFIG, slo, H100, CHAT, TUNING, acceptance=0.3)
    assert diagnosis.out_of_reach, diagnosis.evidence
    decision = propose(diagnosis, PolicyInput(CONFIG, WINDOW, slo, TUNING, H100, workload=CHAT, spec_acceptance=0.3))
    assert isinstance(decision, Infeasible), decision
