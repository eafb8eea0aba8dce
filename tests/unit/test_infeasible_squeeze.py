"""Infeasible from a squeeze measured at the roomiest config (issue 16: called within 2 changes of the evidence).

At every allowed replica, with the batch limit unbound and every knob that helps both latencies set, a window that
misses TTFT and TPOT both (x2.25 and x1.78 on the benchmark's chat-a100-interactive) leaves only knobs that trade one
for the other: that window is the evidence, even when the change to it is rolled back. Speculation, the one knob
that may still shorten decode steps, is measured first when its acceptance never was. The capacity model could not
tell these: it read 6-8 replicas for maxReplicas 4 here, and 5-7 on feasible scenarios that 2-4 replicas carry.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig, SpeculativeConfig
from slotune.loop.state import TuningState
from slotune.loop.tuner import Tuner
from slotune.perfmodel import Deployment
from slotune.policy import Infeasible, PolicyInput, Proposal, infeasible_evidence, propose
from slotune.policy.diagnosis import diagnose
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.snapshot import LatencySummary, MetricsSnapshot
from slotune.tunerbench.evaluator import Evaluator
from slotune.tunerbench.scenario import load_scenarios
from slotune.tunerbench.strategies import run_slotune
from slotune.workload import Profile, WorkloadSpec

A100 = Deployment.from_names("llama-3.1-8b", "a100-40gb")
SLO = SLOSpec.model_validate({"ttft": {"p99": 500}, "tpot": {"p99": 30}})
TUNING = TuningSpec(bounds=KnobBounds(max_replicas=4))
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=34)
ROOMY = RuntimeConfig(max_num_seqs=64, max_num_batched_tokens=512, replicas=4)
NGRAM = SpeculativeConfig(method="ngram", num_speculative_tokens=8)


def _window(config: RuntimeConfig, ttft_ms: float, tpot_ms: float, running: float = 12.4,
            acceptance: float | None = None) -> MetricsSnapshot:
    """A simulated chat window with the measured latencies and batch set to the situation under test."""
    base = simulate_workload(A100, config, CHAT, 150, seed=0).snapshot
    return replace(base, ttft=LatencySummary(p50_ms=ttft_ms / 3, p95_ms=ttft_ms / 1.5, p99_ms=ttft_ms, count=150),
                   tpot=LatencySummary(p50_ms=tpot_ms / 1.3, p95_ms=tpot_ms / 1.1, p99_ms=tpot_ms, count=150),
                   num_running_mean=running, num_waiting_mean=0.6, spec_acceptance_rate=acceptance)


def _decide(config: RuntimeConfig, snapshot: MetricsSnapshot, acceptance: float | None = None,
            tuning: TuningSpec = TUNING) -> Proposal | Infeasible:
    given = PolicyInput(config, snapshot, SLO, tuning, A100, workload=CHAT, spec_acceptance=acceptance)
    return propose(diagnose(snapshot, config, SLO, A100, CHAT, tuning, acceptance), given)


def test_both_latencies_missing_at_the_roomiest_config_try_speculation_first_when_never_measured():
    decision = _decide(ROOMY, _window(ROOMY, 1126, 53.5))
    assert isinstance(decision, Proposal) and decision.knob is Knob.SPECULATIVE, decision
    assert "roomiest" in decision.reason


def test_both_latencies_missing_at_the_roomiest_config_with_speculation_on_is_infeasible():
    # The benchmark's chat-a100-interactive with drafts: TPOT fixed (x1.02), TTFT x4.9 worse for it.
    drafting = ROOMY.with_changes(speculative=NGRAM.model_dump())
    decision = _decide(drafting, _window(drafting, 2435, 30.7, 12.8, acceptance=0.7), acceptance=0.6)
    assert isinstance(decision, Infeasible), decision
    assert "TTFT misses x4.9" in decision.reason and "trade one for the other" in decision.reason
    assert infeasible_evidence(diagnose(_window(drafting, 2435, 30.7, 12.8, 0.7), drafting, SLO, A100, CHAT),
                               PolicyInput(drafting, _window(drafting, 2435, 30.7, 12.8, 0.7), SLO, TUNING, A100,
                                           workload=CHAT, spec_acceptance=0.6)) is not None


def test_without_speculation_allowed_the_first_such_window_is_infeasible():
    plain = TuningSpec(bounds=KnobBounds(max_replicas=4), knobs=[k for k in TuningSpec().knobs
                                                                 if k is not Knob.SPECULATIVE])
    decision = _decide(ROOMY, _window(ROOMY, 1126, 53.5), tuning=plain)
    assert isinstance(decision, Infeasible) and "TTFT misses x2.3 and TPOT x1.8" in decision.reason, decision


def test_the_same_misses_are_no_squeeze_below_max_replicas_with_a_binding_batch_or_near_the_targets():
    plain = TuningSpec(bounds=KnobBounds(max_replicas=4), knobs=[k for k in TuningSpec().knobs
                                                                 if k is not Knob.SPECULATIVE])
    fewer = ROOMY.with_changes(replicas=3)  # a replica left to add
    assert isinstance(_decide(fewer, _window(fewer, 1126, 53.5), tuning=plain), Proposal)
    bound = ROOMY.with_changes(max_num_seqs=16)  # 12.4 of 16 running: a larger batch may still help TTFT
    assert isinstance(_decide(bound, _window(bound, 1126, 53.5), tuning=plain), Proposal)
    near = _decide(ROOMY, _window(ROOMY, 560, 33), tuning=plain)  # x1.12 and x1.10: within a window's noise
    assert not (isinstance(near, Infeasible) and "trade one for the other" in near.reason), near


def test_the_tuner_calls_chat_a100_interactive_infeasible_within_two_changes_of_the_squeeze():
    # The change to 64 sequences at 4 replicas is rolled back (TPOT broke), and its window is still the evidence.
    scenario = next(s for s in load_scenarios(Path("bench/scenarios")) if s.name == "chat-a100-interactive")
    trace = run_slotune(Evaluator(scenario), budget=12)
    assert trace.declared_infeasible and trace.evidence is not None and "trade one for the other" in trace.evidence
    assert trace.changes_to_infeasible is not None and trace.changes_at_evidence is not None
    assert trace.changes_to_infeasible - trace.changes_at_evidence <= 2, trace
    assert trace.changes_to_infeasible <= 2  # it took 7 before: every batch size and budget at 4 replicas


def test_the_prior_acceptance_is_not_recorded_as_measured():
    state = TuningState.initial(ROOMY)
    plain = _window(ROOMY, 1126, 53.5)
    assert Tuner._measured_acceptance(state, plain) is None  # no drafts ran: nothing measured
    drafting = ROOMY.with_changes(speculative=NGRAM.model_dump())
    measured = Tuner._measured_acceptance(state.evolve(current=drafting), _window(drafting, 2435, 30.7, 12.8, 0.7))
    assert measured is not None and 0 < measured < 1


def test_a_rolled_back_replica_step_is_followed_by_the_next_untried_count_not_infeasible():
    """Issue 18's workload-shift e2e: maxReplicas 3, only replicas tuned; 1 -> 2 measured worse (the overloaded
    replica's queue drained into the next window) and was rolled back. The window at 1 still asks for replicas: 3 is
    tried before any Infeasible."""
    h100 = Deployment.from_names("llama-3.1-8b", "h100")
    tuning = TuningSpec(bounds=KnobBounds(max_replicas=3), knobs=[Knob.REPLICAS])
    one, two = RuntimeConfig(max_num_seqs=12, replicas=1), RuntimeConfig(max_num_seqs=12, replicas=2)
    busy = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=13)  # the model sizes 2; the window misses x1.7
    snapshot = simulate_workload(h100, one, busy, 150, seed=0).snapshot
    slo = SLOSpec.model_validate({"ttft": {"p95": 3000}})
    given = PolicyInput(one, snapshot, slo, tuning, h100, frozenset({one.key(), two.key()}), ("replicas=2",),
                        workload=busy)
    decision = propose(diagnose(snapshot, one, slo, h100, busy, tuning), given)
    assert isinstance(decision, Proposal) and decision.config.replicas == 3, decision


def test_both_latencies_missing_at_every_replica_with_whole_prompt_prefill_try_chunked_prefill_first():
    # The benchmark's code-h100-interactive at 4 replicas, chunked prefill off: TTFT x2.3, TPOT x2.8 (0.2 of 8
    # running). Chunked prefill is the one knob left before the roomiest config; the policy used to search batch
    # sizes and budgets first and call it Infeasible only after every remedy, with no evidence window at all.
    whole = RuntimeConfig(max_num_seqs=8, max_num_batched_tokens=16384, enable_chunked_prefill=False,
                          enable_prefix_caching=True, replicas=4)
    decision = _decide(whole, _window(whole, 1166, 82.6, running=0.2))
    assert isinstance(decision, Proposal) and decision.knob is Knob.ENABLE_CHUNKED_PREFILL, decision
    assert decision.config.replicas == 4 and decision.config.enable_chunked_prefill
    fewer = whole.with_changes(replicas=3)  # below every allowed replica: no such shortcut
    assert not (isinstance(d := _decide(fewer, _window(fewer, 1166, 82.6, running=0.2)), Proposal)
                and d.knob is Knob.ENABLE_CHUNKED_PREFILL and "one knob left" in d.reason), d


def test_the_tuner_calls_the_code_scenarios_infeasible_within_two_changes_of_a_squeeze_window():
    # Each was called after every remedy before (5-8 changes) with no window that said so sooner.
    for name in ("code-a100-interactive", "code-h100-interactive", "code-a100-relaxed", "code-l4-relaxed"):
        scenario = next(s for s in load_scenarios(Path("bench/scenarios")) if s.name == name)
        trace = run_slotune(Evaluator(scenario), budget=12)
        assert trace.declared_infeasible and trace.evidence is not None, (name, trace)
        assert "trade one for the other" in trace.evidence, (name, trace.evidence)
        assert trace.changes_to_infeasible is not None and trace.changes_at_evidence is not None
        assert trace.changes_to_infeasible - trace.changes_at_evidence <= 2, (name, trace)
