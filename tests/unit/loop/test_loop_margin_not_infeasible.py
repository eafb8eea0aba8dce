"""Infeasible is never declared while the current config's windows meet the SLO: a change asked for margin (the SLO
tightened to where a noisy streak's confidence bound sits) that no config can give ends Converged without margin.

In a tuner-benchmark world whose machine speed varies +-15% a window, the loop added replicas 1 -> 4 for margin and
then called the config Infeasible at the replica limit while every window at 4 replicas met the SLO."""

from __future__ import annotations

from slotune.api.status import Phase
from slotune.api.tuning import KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop import MemoryStateStore, Tuner, TuningProblem, TuningState
from slotune.perfmodel import Deployment
from slotune.simulator.backend import SimulatedDeployment
from slotune.slo import SLOSpec
from slotune.workload import Profile, WorkloadSpec

H100 = Deployment.from_names("llama-3.1-8b", "h100")
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=5)
SLO = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
# The bound sits where no allowed config can reach: TPOT below every config's floor.
UNREACHABLE_MARGIN = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 0.5}})
TUNING = TuningSpec(cooldown_s=0, min_samples=50, max_iterations=8, bounds=KnobBounds(max_replicas=1))
GOOD = RuntimeConfig(max_num_seqs=64, max_num_batched_tokens=2048)


def test_no_margin_left_while_the_slo_holds_is_converged_not_infeasible():
    world = SimulatedDeployment(H100, CHAT, requests_per_window=120)
    world.apply(GOOD)
    window = world.measure(30)
    assert SLO.is_met(window)
    tuner = Tuner(TuningProblem(SLO, TUNING, H100, GOOD, CHAT), world, world, MemoryStateStore())
    state = TuningState.initial(GOOD).evolve(phase=Phase.MEASURING)
    decided = tuner._decide(state, window, UNREACHABLE_MARGIN)
    assert decided.phase is Phase.CONVERGED, decided.message
    assert decided.infeasible is None and "without margin" in decided.message


def test_a_window_that_misses_still_ends_infeasible_when_nothing_can_help():
    world = SimulatedDeployment(H100, CHAT, requests_per_window=120)
    world.apply(GOOD)
    window = world.measure(30)
    strict = UNREACHABLE_MARGIN
    tuner = Tuner(TuningProblem(strict, TUNING, H100, GOOD, CHAT), world, world, MemoryStateStore())
    state = TuningState.initial(GOOD).evolve(phase=Phase.MEASURING)
    assert tuner._decide(state, window).phase is Phase.INFEASIBLE
