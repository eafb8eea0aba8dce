"""Canary vs before/after verification while the load ramps, in the simulator (slotune.simulator): simulated, not
measured on runtimes, because a ramp's effect on both methods needs many identical repetitions of one ramp.

Each trial: a change is decided on window N (the old config at the load of the ramp then) and applied; the load has
moved by window N+1. Before/after (slotune.judge.verification.verify, as the tuner runs it, including its one extra
window pooled when a verdict is inconclusive) compares window N with window N+1 (and N+2). The canary
(slotune.judge.canary.judge) runs the candidate on one of the replicas during window N+1, the others keep the old
config, the window's requests split round robin, and compares the arms within window N+1. The right answer is known: the
candidate is worse (or better) than the old config at any one load. Time to decision: simulated seconds from applying
the change to the verdict (windows judged x the window length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slotune.judge.canary import CanaryOutcome, judge
from slotune.judge.verification import verify
from slotune.knobs import RuntimeConfig
from slotune.perfmodel import Deployment
from slotune.simulator.cluster import simulate
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, MetricsSnapshot
from slotune.workload import PlannedRequest, Profile, WorkloadSpec, plan_requests

DEPLOYMENT = Deployment.from_names("llama-3.1-8b", "h100")
SLO = SLOSpec.model_validate({"ttft": {"p99": 500}})
WINDOW_S = 30.0
REPLICAS = 4


@dataclass(frozen=True)
class Ramp:
    name: str
    old: RuntimeConfig
    new: RuntimeConfig
    rates_per_s: tuple[float, float, float]  # the load of windows N, N+1, N+2
    new_is_better: bool


_SEQS = {n: RuntimeConfig(max_num_seqs=n, replicas=REPLICAS) for n in (16, 32, 64)}
RAMPS = (
    # 16 sequences queue at 32 req/s and more where 32 do not: worse at any one load, but the fall hides it.
    Ramp("worse change, load falls", _SEQS[32], _SEQS[16], (60.0, 32.0, 24.0), new_is_better=False),
    Ramp("worse change, steady load", _SEQS[32], _SEQS[16], (40.0, 40.0, 40.0), new_is_better=False),
    # 64 sequences hold 72 req/s where 32 queue: better at that load, but the rise hides it.
    Ramp("better change, load rises", _SEQS[32], _SEQS[64], (48.0, 72.0, 80.0), new_is_better=True),
    Ramp("better change, steady load", _SEQS[32], _SEQS[64], (72.0, 72.0, 72.0), new_is_better=True),
)


def _requests(rate_per_s: float, seed: int) -> list[PlannedRequest]:
    workload = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=rate_per_s)
    return plan_requests(workload, num_requests=round(rate_per_s * WINDOW_S), seed=seed)


def _window(config: RuntimeConfig, requests: list[PlannedRequest]) -> MetricsSnapshot:
    return simulate(DEPLOYMENT, config, requests).snapshot


def before_after(ramp: Ramp, seed: int) -> tuple[bool, int]:
    """(kept, windows judged after the change) as the tuner's before/after verification decides."""
    baseline = _window(ramp.old, _requests(ramp.rates_per_s[0], seed))
    first = _window(ramp.new, _requests(ramp.rates_per_s[1], seed + 1))
    verdict = verify(baseline, first, LatencyMetric.TTFT, 99, SLO)
    if not verdict.inconclusive:
        return verdict.keep, 1
    second = _window(ramp.new, _requests(ramp.rates_per_s[2], seed + 2))
    return verify(baseline, second, LatencyMetric.TTFT, 99, SLO, earlier_after=first).keep, 2


def canary(ramp: Ramp, seed: int) -> tuple[CanaryOutcome, int]:
    """(outcome, windows judged after the change): one replica of REPLICAS runs the candidate in window N+1."""
    requests = _requests(ramp.rates_per_s[1], seed + 1)
    canary_share = requests[0::REPLICAS]
    siblings = [r for index, r in enumerate(requests) if index % REPLICAS]
    arm = _window(ramp.new.with_changes(replicas=1), canary_share)
    rest = _window(ramp.old.with_changes(replicas=REPLICAS - 1), siblings)
    return judge(rest, arm, LatencyMetric.TTFT, 99, SLO).outcome, 1


def run_ramps(trials: int) -> list[dict[str, Any]]:
    found = []
    for ramp in RAMPS:
        ba = [before_after(ramp, 1000 * t) for t in range(trials)]
        ca = [canary(ramp, 1000 * t) for t in range(trials)]
        right_ba = sum(kept == ramp.new_is_better for kept, _ in ba)
        right_ca = sum((outcome is CanaryOutcome.PROMOTE) == ramp.new_is_better for outcome, _ in ca)
        found.append({
            "ramp": ramp.name, "old": ramp.old.describe(), "new": ramp.new.describe(),
            "change": f"max_num_seqs {ramp.old.max_num_seqs} -> {ramp.new.max_num_seqs} on {REPLICAS} replicas",
            "rates_per_s": list(ramp.rates_per_s), "new_is_better": ramp.new_is_better, "trials": trials,
            "before_after_right": right_ba / trials, "canary_right": right_ca / trials,
            "canary_outcomes": {o.value: sum(c is o for c, _ in ca) for o in CanaryOutcome},
            "before_after_time_to_decision_s": sum(w for _, w in ba) / trials * WINDOW_S,
            "canary_time_to_decision_s": sum(w for _, w in ca) / trials * WINDOW_S,
        })
    return found
