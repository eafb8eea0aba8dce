"""Online calibration: a window's mean step time against the profile's, on simulated windows whose hardware is known
(the simulator runs the same roofline, so an unskewed window must read ~1 and a slowed one its slowdown)."""

from __future__ import annotations

import pytest

from slotune.knobs import RuntimeConfig, SpeculativeConfig
from slotune.perfmodel import Deployment
from slotune.perfmodel.window_step import speed_ratio
from slotune.simulator import simulate_workload
from slotune.workload import Profile, WorkloadSpec

H100 = Deployment.from_names("llama-3.1-8b", "h100")
L4 = Deployment.from_names("llama-3.1-8b", "l4")
CHUNKED = RuntimeConfig(max_num_seqs=64, max_num_batched_tokens=512)
WHOLE_BUDGET = RuntimeConfig(max_num_seqs=16, max_num_batched_tokens=2048, enable_prefix_caching=False)
CASES = [(H100, Profile.CHAT, 5), (H100, Profile.CHAT, 20), (H100, Profile.SUMMARIZATION, 2),
         (L4, Profile.CHAT, 5), (L4, Profile.SUMMARIZATION, 2)]


def _ratio(profile: Deployment, served_by: Deployment, config: RuntimeConfig, workload: WorkloadSpec) -> float | None:
    snapshot = simulate_workload(served_by, config, workload, 300, seed=0).snapshot
    return speed_ratio(profile, config, snapshot)


@pytest.mark.parametrize("config", [CHUNKED, WHOLE_BUDGET], ids=["chunked-512", "budget-2048"])
@pytest.mark.parametrize(("deployment", "profile", "rate"), CASES, ids=lambda v: getattr(v, "value", str(v)))
def test_hardware_as_profiled_reads_one_and_slower_hardware_its_slowdown(deployment, profile, rate, config):
    # Steps with a prefill chunk take longer than pure decodes (the max() of the roofline is convex), so the ratio
    # prices the window as a mix of both; pricing its mean step alone read 1.1-1.4 on these same windows.
    workload = WorkloadSpec(profile=profile, request_rate_per_s=rate)
    assert _ratio(deployment, deployment, config, workload) == pytest.approx(1.0, abs=0.06)
    assert _ratio(deployment, deployment.slower(1.5), config, workload) == pytest.approx(1.5, rel=0.08)


def test_windows_that_cannot_tell_give_no_ratio():
    workload = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=5)
    drafting = CHUNKED.with_changes(speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=4,
                                                                  draft_model=None).model_dump())
    assert _ratio(H100, H100, drafting, workload) is None  # a step yields several tokens per sequence
    idle = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=0.05)
    assert _ratio(H100, H100, CHUNKED, idle) is None  # under one sequence running on average
