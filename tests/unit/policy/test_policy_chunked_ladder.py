"""Chunked prefill is searched along its budgets before it is given up, and no proposal is a config the API refuses
(issue 30, item 3).

Observed: with chunked prefill off and long prompts, the loop turned chunked prefill on only together with a
2048-token budget; rolled back, that was never tried with a smaller budget, and the loop went on to propose chunked
prefill off with a budget below max_model_len, which `slotune validate` refuses. Chunked prefill at 256-512 tokens
met the SLO.
"""

from __future__ import annotations

from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel import Deployment
from slotune.policy import Infeasible, PolicyInput, Proposal, move_key, propose
from slotune.policy.diagnosis import diagnose
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.workload import Profile, WorkloadSpec
from tests.unit.policy.api_validity import api_refusal

H100 = Deployment.from_names("llama-3.1-8b", "h100")  # max_model_len 8192
LONG_PROMPTS = WorkloadSpec(profile=Profile.SUMMARIZATION, request_rate_per_s=3)
TIGHT_TPOT = SLOSpec.model_validate({"tpot": {"p50": 10, "p99": 11}})
WHOLE_PROMPTS = RuntimeConfig(max_num_seqs=8, max_num_batched_tokens=8192, enable_chunked_prefill=False)


def rolled_back_walk(config: RuntimeConfig, workload: WorkloadSpec, slo: SLOSpec, tuning: TuningSpec,
                     deployment: Deployment = H100, steps: int = 8) -> list[Proposal]:
    """The proposals from one window when each is tried and rolled back in turn (the loop returns to `config`)."""
    snapshot = simulate_workload(deployment, config, workload, 150, seed=0).snapshot
    diagnosis = diagnose(snapshot, config, slo, deployment, workload)
    tried: list[Proposal] = []
    for _ in range(steps):
        given = PolicyInput(config, snapshot, slo, tuning, deployment, frozenset(p.config.key() for p in tried),
                            tuple(move_key(config, p.config) for p in tried), workload=workload)
        decision = propose(diagnosis, given)
        if isinstance(decision, Infeasible):
            tried += [decision.best_effort] if decision.best_effort else []
            break
        tried.append(decision)
    return tried


def test_chunked_prefill_rolled_back_at_2048_tokens_is_tried_at_smaller_budgets_down_to_256():
    tuning = TuningSpec(bounds=KnobBounds(max_replicas=1))
    walk = rolled_back_walk(WHOLE_PROMPTS, LONG_PROMPTS, TIGHT_TPOT, tuning)
    chunked = [p.config.max_num_batched_tokens for p in walk if p.config.enable_chunked_prefill]
    assert chunked[:4] == [2048, 1024, 512, 256], [p.change for p in walk]
    assert all(p.knob is Knob.ENABLE_CHUNKED_PREFILL for p in walk[:4]), [p.change for p in walk]


def test_no_proposal_after_chunked_prefill_was_rolled_back_is_refused_by_the_api():
    for tuning in (TuningSpec(bounds=KnobBounds(max_replicas=1)), TuningSpec(bounds=KnobBounds(max_replicas=4))):
        for proposal in rolled_back_walk(WHOLE_PROMPTS, LONG_PROMPTS, TIGHT_TPOT, tuning, steps=12):
            refusal = api_refusal(proposal.config, tuning, H100.max_model_len)
            assert refusal is None, f"{proposal.change}: {refusal}"
