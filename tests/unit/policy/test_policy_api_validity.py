"""Every config the policy proposes is one the API accepts (issue 30, item 3): written as a TunedModel's starting
config under the same tuning, `slotune validate` takes it. Checked over windows of many workloads, SLOs and starting
configs, with each proposal rolled back in turn so the fallbacks behind the first remedies are proposed too."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slotune.api.tuning import KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel import Deployment
from slotune.policy import Infeasible, PolicyInput, Proposal, move_key, propose, propose_trim
from slotune.policy.diagnosis import diagnose
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.workload import Profile, WorkloadSpec
from tests.unit.policy.api_validity import api_refusal

SLOS = (
    SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}}),
    SLOSpec.model_validate({"ttft": {"p99": 500}, "tpot": {"p99": 30}}),
    SLOSpec.model_validate({"tpot": {"p50": 10, "p99": 11}}),
    SLOSpec.model_validate({"ttft": {"p50": 250}}),
)


def _proposals(config: RuntimeConfig, given: PolicyInput, slo: SLOSpec, steps: int) -> list[Proposal]:
    """Each proposal from one window, every earlier one tried and rolled back (trims once the window meets the SLO)."""
    diagnosis = diagnose(given.snapshot, config, slo, given.deployment, given.workload)
    tried: list[Proposal] = []
    for _ in range(steps):
        now = PolicyInput(config, given.snapshot, slo, given.tuning, given.deployment,
                          frozenset(p.config.key() for p in tried), tuple(move_key(config, p.config) for p in tried),
                          workload=given.workload)
        decision = propose_trim(now) if diagnosis.primary is None else propose(diagnosis, now)
        if isinstance(decision, Infeasible):
            return [*tried, *([decision.best_effort] if decision.best_effort else [])]
        if decision is None:
            return tried
        tried.append(decision)
    return tried


@settings(max_examples=40, deadline=None)
@given(accelerator=st.sampled_from(("h100", "l4")), max_model_len=st.sampled_from((4096, 8192)),
       profile=st.sampled_from((Profile.CHAT, Profile.CODE, Profile.SUMMARIZATION)),
       rate=st.sampled_from((1.0, 4.0, 12.0)), slo=st.sampled_from(SLOS),
       seqs=st.sampled_from((4, 16, 64)), budget=st.sampled_from((512, 2048, 8192, 16384)),
       chunked=st.booleans(), replicas=st.sampled_from((1, 2)), max_replicas=st.sampled_from((2, 4)))
def test_every_proposal_passes_the_api_validation(accelerator: str, max_model_len: int, profile: Profile,
                                                   rate: float, slo: SLOSpec, seqs: int, budget: int, chunked: bool,
                                                   replicas: int, max_replicas: int) -> None:
    deployment = Deployment.from_names("llama-3.1-8b", accelerator, max_model_len=max_model_len)
    tuning = TuningSpec(bounds=KnobBounds(max_replicas=max_replicas))
    config = RuntimeConfig(max_num_seqs=seqs, max_num_batched_tokens=budget, enable_chunked_prefill=chunked,
                           replicas=replicas)
    assume(api_refusal(config, tuning, max_model_len) is None and deployment.startup_error(config) is None)
    workload = WorkloadSpec(profile=profile, request_rate_per_s=rate)
    snapshot = simulate_workload(deployment, config, workload, 120, seed=0).snapshot
    start = PolicyInput(config, snapshot, slo, tuning, deployment, workload=workload)
    for proposal in _proposals(config, start, slo, steps=6):
        refusal = api_refusal(proposal.config, tuning, max_model_len)
        assert refusal is None, f"from {config.describe()}: {proposal.change}: {refusal}"
