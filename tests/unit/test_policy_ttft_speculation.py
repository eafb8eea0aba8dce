"""A first-token miss that is queueing behind slow decodes is not Infeasible while speculation is unmeasured.

Issue 17's SmolLM2 run ended Infeasible on a TTFT-only near miss (x1.11 at 8 s) with speculation allowed and never
measured: the TTFT remedies held no speculation, and the squeeze needs both latencies to miss. When the queue makes
the TTFT and the requests holding the batch's slots spend most of their time decoding, drafted tokens shorten each
decode and so the wait (policy.remedies._queued_behind_decodes).
"""

from __future__ import annotations

from dataclasses import replace

from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel import Deployment
from slotune.policy import Infeasible, PolicyInput, Proposal, propose
from slotune.policy.diagnosis import Bottleneck, diagnose
from slotune.simulator import simulate_workload
from slotune.slo import SLOSpec
from slotune.snapshot import LatencySummary, MetricsSnapshot
from slotune.workload import Profile, WorkloadSpec

L4 = Deployment.from_names("llama-3.1-8b", "l4")
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=2)
SLO = SLOSpec.model_validate({"ttft": {"p99": 8000}, "tpot": {"p99": 600}})
# Only replicas and drafts are tuned, and every allowed replica runs: no plain remedy is left.
TUNING = TuningSpec(bounds=KnobBounds(max_replicas=2), knobs=[Knob.REPLICAS, Knob.SPECULATIVE])
AT_MOST = RuntimeConfig(max_num_seqs=4, replicas=2)


def _summary(p50_ms: float, p99_ms: float) -> LatencySummary:
    return LatencySummary(p50_ms=p50_ms, p95_ms=(p50_ms + p99_ms) / 2, p99_ms=p99_ms, count=150)


def _window(decode_p50_ms: float, prefill_p50_ms: float) -> MetricsSnapshot:
    """TTFT p99 8.9 s against 8 s (x1.11), 7 s of it queued, TPOT well within its target, 4 of 4 running."""
    base = simulate_workload(L4, AT_MOST, CHAT, 150, seed=0).snapshot
    return replace(base, ttft=_summary(2500, 8880), queue=_summary(2000, 7000), tpot=_summary(60, 90),
                   prefill=_summary(prefill_p50_ms, 3 * prefill_p50_ms), decode=_summary(decode_p50_ms, 40_000),
                   num_running_mean=3.9, num_waiting_mean=3.0, spec_acceptance_rate=None)


def _decide(snapshot: MetricsSnapshot, acceptance: float | None = None) -> Proposal | Infeasible:
    given = PolicyInput(AT_MOST, snapshot, SLO, TUNING, L4, workload=CHAT, spec_acceptance=acceptance)
    return propose(diagnose(snapshot, AT_MOST, SLO, L4, CHAT, TUNING, acceptance), given)


def test_a_ttft_miss_queued_behind_decodes_tries_speculation_before_infeasible():
    window = _window(decode_p50_ms=15_000, prefill_p50_ms=400)
    assert diagnose(window, AT_MOST, SLO, L4, CHAT, TUNING).bottleneck is Bottleneck.CAPACITY
    decision = _decide(window)
    assert isinstance(decision, Proposal) and decision.knob is Knob.SPECULATIVE, decision
    assert decision.target_metric.value == "ttft" and "queueing behind decodes" in decision.reason


def test_not_when_prefill_not_decode_holds_the_slots():
    decision = _decide(_window(decode_p50_ms=300, prefill_p50_ms=2_000))
    assert isinstance(decision, Infeasible), decision


def test_not_when_the_measured_acceptance_makes_drafts_a_loss():
    decision = _decide(_window(decode_p50_ms=15_000, prefill_p50_ms=400), acceptance=0.01)
    assert isinstance(decision, Infeasible), decision
