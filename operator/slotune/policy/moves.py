"""Single-knob moves, each sized for the window at hand, or None where the knob cannot help (already set, out of
bounds, not allowed by the spec, predicted to break the throughput floor)."""

from __future__ import annotations

from dataclasses import dataclass

from slotune.api.tuning import Knob
from slotune.knobs import Quantization, RuntimeConfig, SpeculativeConfig
from slotune.perfmodel import capacity
from slotune.policy.inputs import PolicyInput, Remedy
from slotune.policy.sizing import max_replicas, replicas_for_load, tpot_target
from slotune.snapshot import LatencyMetric

PRIOR_ACCEPTANCE = 0.5  # per-token acceptance assumed before speculation was ever measured
MIN_SPECULATION_SPEEDUP = 1.3  # predicted decode speedup worth a change whose acceptance is only a prior


def budget_up(given: PolicyInput, why: str) -> Remedy | None:
    c, bounds = given.config, given.tuning.bounds
    budget = min(max(c.max_num_batched_tokens * 4, 2048), bounds.max_num_batched_tokens.max, budget_cap(given))
    if budget <= c.max_num_batched_tokens:
        return None
    return Remedy(c.with_changes(max_num_batched_tokens=budget), Knob.MAX_NUM_BATCHED_TOKENS,
                  f"{why}; a {budget}-token step still fits the TPOT target")


def budget_cap(given: PolicyInput) -> int:
    s = given.snapshot
    batch = max(1, round(s.num_running_mean or 1))
    return capacity.budget_limit(given.deployment, given.config, tpot_target(given.slo), batch,
                                 s.mean_decode_context_tokens)


def enable_prefix_cache(given: PolicyInput) -> Remedy | None:
    c, workload = given.config, given.workload
    shared = workload is not None and bool(workload.shared_prefix_tokens) and bool(workload.shared_prefix_share)
    if c.enable_prefix_caching or not shared:
        return None
    return Remedy(c.with_changes(enable_prefix_caching=True), Knob.ENABLE_PREFIX_CACHING,
            "the workload shares prompt prefixes that are recomputed on every request")


def chunked_prefill(given: PolicyInput, why: str, target: LatencyMetric | None = None) -> Remedy | None:
    c, bounds = given.config, given.tuning.bounds
    if c.enable_chunked_prefill:
        return None
    budget = max(min(c.max_num_batched_tokens, 2048), bounds.max_num_batched_tokens.min)
    return Remedy(c.with_changes(enable_chunked_prefill=True, max_num_batched_tokens=budget),
                  Knob.ENABLE_CHUNKED_PREFILL, why, target)


def replicas_remedy(given: PolicyInput, why: str) -> Remedy | None:
    c = given.config
    most = max_replicas(given)
    wanted = min(max(c.replicas + 1, replicas_for_load(given, c)), most)
    if wanted <= c.replicas:
        return None
    return Remedy(c.with_changes(replicas=wanted), Knob.REPLICAS, why)


def quantize(given: PolicyInput, why: str) -> Remedy | None:
    c, tuning = given.config, given.tuning
    if not tuning.allow_quality_change or c.quantization is not Quantization.NONE:
        return None
    fp8 = given.deployment.accelerator.fp8_flops_per_s is not None
    quant = Quantization.FP8 if fp8 else Quantization.INT8
    return Remedy(c.with_changes(quantization=quant), Knob.QUANTIZATION, why)


def speculate(given: PolicyInput, batch: float) -> Remedy | None:
    """Speculation where the roofline says verifying k drafted tokens costs little more than one: decode is bound
    by reading weights, not by compute, at this batch (small batches, low-bandwidth accelerators). Proposed only if
    the predicted speedup at the window's batch is worth it and the throughput floor still holds."""
    c, bounds, floor = given.config, given.tuning.bounds, given.slo.min_throughput
    if c.speculative is not None:
        return None
    k = min(max(4, bounds.num_speculative_tokens.min), bounds.num_speculative_tokens.max)
    method = bounds.speculative_methods[0]
    config = c.with_changes(speculative=SpeculativeConfig(method=method, num_speculative_tokens=k,
                                                          draft_model=None).model_dump())
    predicted = speculation_estimate(given, config, batch)
    if predicted.speedup < MIN_SPECULATION_SPEEDUP or (
            floor is not None and predicted.tokens_per_s * c.replicas < floor):
        return None
    return Remedy(config, Knob.SPECULATIVE, f"decode is bound by weight reads at {batch:.1f} sequences per step: "
                  f"verifying {k} drafted tokens costs x{predicted.step_cost:.2f} a step, a predicted "
                  f"x{predicted.speedup:.1f} per token")


@dataclass(frozen=True)
class SpeculationEstimate:
    speedup: float  # tokens per second with speculation / without
    step_cost: float  # step time with / without
    tokens_per_s: float  # one replica's decode throughput with speculation


def speculation_estimate(given: PolicyInput, config: RuntimeConfig, batch: float) -> SpeculationEstimate:
    """Speculation at `batch` sequences: the expected tokens a step yields with per-token acceptance a,
    (1 - a^(k+1)) / (1 - a), against the roofline's cost of verifying k + 1 tokens per sequence."""
    assert config.speculative is not None
    b, context = max(1, round(batch)), given.snapshot.mean_decode_context_tokens
    k, a = config.speculative.num_speculative_tokens, PRIOR_ACCEPTANCE
    tokens_per_step = (1 - a ** (k + 1)) / (1 - a)
    plain_s = given.deployment.step_model(given.config).decode_step_s(b, context)
    drafting_s = given.deployment.step_model(config).decode_step_s(b, context, tokens_per_seq=k + 1)
    return SpeculationEstimate(tokens_per_step * plain_s / drafting_s, drafting_s / plain_s,
                               b * tokens_per_step / drafting_s)
