"""Sizing and checks the remedies share: the window's load, the TPOT target, replicas a load needs, whether the batch
limit binds, whether a config may be proposed at all, and how a change is named."""

from __future__ import annotations

import math

from slotune.api.spec import config_refusals
from slotune.api.tuning import Knob
from slotune.knobs import RuntimeConfig, SpeculativeConfig
from slotune.perfmodel import capacity
from slotune.perfmodel.queueing import erlang_c
from slotune.policy.diagnosis import window_acceptance
from slotune.policy.inputs import PolicyInput
from slotune.slo import LatencyMetric, SLOSpec

MAX_MOVE_ATTEMPTS = 2  # a knob setting rolled back this often is not proposed again (hysteresis)
BATCH_BINDS_SHARE = 0.5  # mean running sequences at or above this share of max_num_seqs: the limit binds
NEAR_MISS = 2.0  # worst observed / target at or under this: the window missed by less than the model errs


def load_of(given: PolicyInput) -> capacity.Load:
    s = given.snapshot
    shared = 0.0
    if given.workload is not None and given.workload.shared_prefix_tokens:
        shared = (given.workload.shared_prefix_share or 0.0) * given.workload.shared_prefix_tokens / max(
            s.mean_prompt_tokens or 1.0, 1.0)
    return capacity.Load(s.request_rate_per_s, s.mean_prompt_tokens or 1.0, s.mean_generation_tokens or 1.0, shared,
                         acceptance_of(given))


def acceptance_of(given: PolicyInput) -> float:
    """Per-token draft acceptance: this window's when it speculates, else measured before on this workload, else
    the prior."""
    return window_acceptance(given.snapshot, given.config, given.spec_acceptance)


def tpot_target(slo: SLOSpec) -> float | None:
    return None if slo.tpot is None else min(v for v in (slo.tpot.p50, slo.tpot.p95, slo.tpot.p99) if v)


def replicas_for_load(given: PolicyInput, config: RuntimeConfig) -> int:
    return capacity.replicas_needed(given.deployment, config, load_of(given), tpot_target(given.slo))


def worst_miss(given: PolicyInput) -> float:
    """The window's worst observed / target ratio over the SLO's percentile targets (1.0 or less: none missed)."""
    ratios = [observed / t.target_ms for t in given.slo.targets()
              if (observed := given.snapshot.latency(t.metric).at(t.percentile)) is not None]
    return max(ratios, default=1.0)


def max_replicas(given: PolicyInput) -> int:
    bounds = given.tuning.bounds
    return bounds.max_replicas if bounds.max_replicas is not None else given.config.replicas


def batch_binds(given: PolicyInput) -> bool:
    """Whether max_num_seqs can be what queues requests: the window ran at least half of it on average, or, with
    few slots, arrivals found every slot taken more often than the first-token target's percentile allows (Erlang C
    at the measured occupancy: 4 slots at 1.5 running on average are all taken for ~7% of arrivals, a P99 TTFT's
    whole tail; with chunked prefill, so that admission waits for a slot and not for whole-prompt prefill steps).
    Requests waiting while most of many slots stay free wait for something else (prompt compute, whole-prompt
    prefill steps), and a larger batch only adds decodes to every step."""
    running, slots = given.snapshot.num_running_mean or 0.0, given.config.max_num_seqs
    if running >= BATCH_BINDS_SHARE * slots:
        return True
    # Without chunked prefill a waiting request waits for whole-prompt prefill steps, not for a slot.
    return given.config.enable_chunked_prefill and erlang_c(slots, running) > first_token_tail(given.slo)


def first_token_tail(slo: SLOSpec) -> float:
    """The share of requests a first-token target lets miss: 0.01 for a P99 TTFT (or end-to-end, where no TTFT is
    set) target, the strictest where there are several; 0.01 where neither is set."""
    targets = [t for t in slo.targets() if t.metric is LatencyMetric.TTFT] or \
        [t for t in slo.targets() if t.metric is LatencyMetric.E2E]
    return min((1.0 - t.percentile / 100.0 for t in targets), default=0.01)


def batch_failed(given: PolicyInput) -> bool:
    """A larger max_num_seqs was tried and rolled back before (it broke another target, typically TPOT)."""
    return any(move.startswith("max_num_seqs=") for move in given.rolled_back_moves)


def admissible(config: RuntimeConfig, knob: Knob, given: PolicyInput, revisit: bool = False) -> bool:
    """Whether a config may be proposed: its knob allowed, a config the API accepts (`api.spec.config_refusals`,
    max_model_len as the deployment has it), not futile, never tried, not rolled back too often, and one that starts.
    `revisit`: a config tried before may be returned to (never one that failed to start: the deployment's startup
    check still applies)."""
    if knob not in given.tuning.knobs or config == given.config:
        return False
    if config_refusals(config, given.tuning, given.deployment.max_model_len):
        return False
    if given.futile_moves and move_direction(given.config, config, knob) in given.futile_moves:
        return False
    if config.key() in given.excluded_keys and not revisit:
        return False
    if knob is not Knob.REPLICAS and given.rolled_back_moves.count(move_key(given.config, config)) >= \
            MAX_MOVE_ATTEMPTS:
        return False
    error = given.deployment.startup_error(config)
    return error is None


def pow2_at_most(value: float) -> int:
    return 1 << max(0, math.floor(math.log2(max(value, 1.0))))


def costs_nothing(old: RuntimeConfig, new: RuntimeConfig) -> bool:
    """Turning prefix caching on only skips recomputing tokens already in the cache (vLLM V1 enables it by
    default); every other change trades something away."""
    return old.changed_knobs(new) == {"enable_prefix_caching"} and new.enable_prefix_caching


def move_direction(old: RuntimeConfig, new: RuntimeConfig, knob: Knob) -> str:
    """Which way a change moves its knob: 'max_num_batched_tokens up' (a number), 'speculative on' (any other
    setting away from off: none, false, auto), 'speculative off'. A knob measured not to move the windows that miss
    one way may still be the fix the other way (a smaller token budget for TPOT after a larger one did nothing for
    TTFT)."""
    before, after = getattr(old, knob.value), getattr(new, knob.value)
    if isinstance(after, int) and not isinstance(after, bool):
        return f"{knob.value} {'up' if after > before else 'down'}"
    off = after is None or after is False or getattr(after, "value", None) in ("none", "auto")
    return f"{knob.value} {'off' if off else 'on'}"


def move_key(old: RuntimeConfig, new: RuntimeConfig) -> str:
    """The knob values a change sets, e.g. 'max_num_batched_tokens=2048', whatever else differs."""
    return ",".join(f"{k}={show(getattr(new, k))}" for k in sorted(old.changed_knobs(new)))


def describe_change(old: RuntimeConfig, new: RuntimeConfig, knob: Knob) -> str:
    parts = []
    for name in sorted(old.changed_knobs(new)):
        before, after = getattr(old, name), getattr(new, name)
        parts.append(f"{name} {show(before)} -> {show(after)}")
    return ", ".join(parts) or knob.value


def show(value: object) -> str:
    if isinstance(value, SpeculativeConfig):
        return f"{value.method.value}x{value.num_speculative_tokens}"
    return "off" if value is None else str(getattr(value, "value", value))
