"""Local mode's step: a Tuner step that only names a time to come back (a cooldown after a change) is waited out,
so every step local mode counts judged a window. The simulator is the deployment."""

from __future__ import annotations

import time

from slotune.api.tuning import KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.local.command import _step
from slotune.loop import MemoryStateStore, Tuner, TuningProblem
from slotune.perfmodel import Deployment
from slotune.simulator.backend import SimulatedDeployment
from slotune.slo import SLOSpec
from slotune.workload import Profile, WorkloadSpec

H100 = Deployment.from_names("llama-3.1-8b", "h100")
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=20)
SLO = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
POOR = RuntimeConfig(max_num_seqs=4, max_num_batched_tokens=512, enable_prefix_caching=False)
COOLDOWN_S = 0.3


def test_a_cooldown_is_waited_out_and_the_step_judges_a_window() -> None:
    tuning = TuningSpec(cooldown_s=COOLDOWN_S, min_samples=50, max_iterations=8, bounds=KnobBounds(max_replicas=4))
    world = SimulatedDeployment(H100, CHAT, requests_per_window=120)
    tuner = Tuner(TuningProblem(SLO, tuning, H100, POOR, CHAT), world, world, MemoryStateStore())
    changed = _step(tuner)  # the baseline misses the SLO: a change is applied, a cooldown starts
    assert changed.pending is not None and changed.cooldown_until_s > time.time()
    judged = _step(tuner)
    assert time.time() >= changed.cooldown_until_s
    assert judged.iteration == changed.iteration + 1, "the step after the cooldown measured and judged a window"
