"""Windows under minSamples pool with the next ones of the same config instead of being discarded: a slow config
serves few requests a window (a closed-loop workload at one sequence at a time on busy cores), and a loop that
dropped each such window would never judge it, so never change it."""

from __future__ import annotations

from slotune.api.status import Phase
from slotune.api.tuning import KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop import MemoryStateStore, Tuner, TuningProblem
from slotune.perfmodel import Deployment
from slotune.simulator.backend import SimulatedDeployment
from slotune.slo import SLOSpec
from slotune.workload import Profile, WorkloadSpec

H100 = Deployment.from_names("llama-3.1-8b", "h100")
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=8)
SLO = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})


def _tuner(requests_per_window: int, min_samples: int) -> tuple[Tuner, MemoryStateStore]:
    world = SimulatedDeployment(H100, CHAT, requests_per_window=requests_per_window)
    tuning = TuningSpec(cooldown_s=0, min_samples=min_samples, max_iterations=6, bounds=KnobBounds(max_replicas=4))
    store = MemoryStateStore()
    poor = RuntimeConfig(max_num_seqs=1, max_num_batched_tokens=512, enable_prefix_caching=False)
    return Tuner(TuningProblem(SLO, tuning, H100, poor, CHAT), world, world, store), store


def test_windows_under_min_samples_pool_until_they_reach_it():
    tuner, _ = _tuner(requests_per_window=20, min_samples=50)
    first, second = tuner.step(), tuner.step()  # the first deploys, then measures: the simulator is at once
    assert first.iteration == 0 and second.iteration == 0  # 20, then 40 requests: not judged yet
    short = first.measured.short
    assert short is not None and short.num_requests == 20 and "pooled with the next" in first.message
    assert second.measured.short is not None and second.measured.short.num_requests == 40
    third = tuner.step()  # 60 >= 50: judged on the three windows pooled
    assert third.iteration == 1 and third.measured.short is None
    assert third.pending is not None  # one sequence at a time misses the SLO: a change is made


def test_a_loop_fed_only_small_windows_still_tunes_to_its_slo():
    tuner, _ = _tuner(requests_per_window=20, min_samples=50)
    state = tuner.run(max_windows=60)
    assert state.phase is Phase.CONVERGED, state.message
    assert state.current.max_num_seqs > 1


def test_a_short_window_of_another_config_is_not_pooled():
    tuner, store = _tuner(requests_per_window=20, min_samples=50)
    small = tuner.step()
    assert small.measured.short is not None
    store.save(small.evolve(short_of="some other config"))
    after = tuner.step()
    short = after.measured.short
    assert short is not None and short.num_requests == 20  # started over: the old window was dropped
