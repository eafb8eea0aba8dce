"""The profiler's capacity is a rate one replica sustains (slotune.tracebench.profile): a rate is held long enough for
an overload to fill the batch and then queue, not judged on the transient of an engine that starts empty."""

from __future__ import annotations

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.slo import SLOSpec
from slotune.tracebench.profile import MAX_REQUESTS, NUM_REQUESTS, OVERLOAD, meets_at, profile_capacity, stretch_length
from slotune.workload import PlannedRequest

SLO = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
A100 = Deployment.from_names("llama-3.1-8b", "nvidia-a100-40gb")
DEFAULTS = RuntimeConfig(max_num_seqs=256, max_num_batched_tokens=2048, enable_chunked_prefill=True,
                         enable_prefix_caching=True, replicas=1)  # vLLM's, as the trace benchmark's baselines run
# Chat-like lengths: prompts 400-2,000 tokens, outputs 60-360, in a fixed order (the profile cycles through them).
LENGTHS = [PlannedRequest(0.0, 400 + (i * 337) % 1600, 60 + (i * 53) % 300, None, 0) for i in range(500)]


def test_the_stretch_fills_the_batch_then_queues_a_ttft_targets_worth_at_the_overload_it_must_show() -> None:
    few = DEFAULTS.with_changes(max_num_seqs=64)
    assert stretch_length(few, SLO, 10.0) == NUM_REQUESTS + round((64 + 2.0 * 10.0) / OVERLOAD)
    assert stretch_length(few, SLO, 20.0) > stretch_length(few, SLO, 10.0) > stretch_length(few, SLO, 1.0)
    tpot_only = SLOSpec.model_validate({"tpot": {"p99": 100}})
    assert stretch_length(few, tpot_only, 10.0) == NUM_REQUESTS + round(64 / OVERLOAD)
    assert stretch_length(DEFAULTS, SLO, 100.0) == MAX_REQUESTS


def test_the_profiled_rate_is_held_where_a_short_stretch_above_it_would_have_passed() -> None:
    rate = profile_capacity(A100, DEFAULTS, SLO, LENGTHS).rate_per_s
    assert meets_at(A100, DEFAULTS, SLO, LENGTHS, rate)
    above = 1.25 * rate
    # An empty engine takes 300 requests at a quarter above that rate into a growing batch and meets the SLO...
    assert meets_at(A100, DEFAULTS, SLO, LENGTHS, above, count=NUM_REQUESTS)
    # ...held until the batch is full and a queue has had time to build, it does not.
    assert not meets_at(A100, DEFAULTS, SLO, LENGTHS, above)
