"""Single-knob moves, each sized for the window at hand, or None where the knob cannot help (already set, out of
bounds, not allowed by the spec, predicted to break the throughput floor)."""

from __future__ import annotations

from slotune.api.tuning import Knob
from slotune.knobs import Quantization, RuntimeConfig, SpeculativeConfig
from slotune.metrics.snapshot import LatencyMetric
from slotune.perfmodel import capacity
from slotune.policy.inputs import PolicyInput, Remedy
from slotune.policy.sizing import max_replicas, replicas_for_load, tpot_target

SPECULATION_MAX_BATCH = 8  # verification is ~free only while decode stays bandwidth bound
PRIOR_ACCEPTANCE = 0.5  # per-token acceptance assumed before speculation was ever measured


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
    context = (s.mean_prompt_tokens or 0.0) + (s.mean_generation_tokens or 0.0) / 2
    return capacity.budget_limit(given.deployment, given.config, tpot_target(given.slo), batch, context)


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
    c, bounds = given.config, given.tuning.bounds
    if c.speculative is not None or batch > SPECULATION_MAX_BATCH:
        return None
    k = min(max(4, bounds.num_speculative_tokens.min), bounds.num_speculative_tokens.max)
    method = bounds.speculative_methods[0]
    config = c.with_changes(speculative=SpeculativeConfig(method=method, num_speculative_tokens=k,
                                                          draft_model=None).model_dump())
    if not _keeps_throughput_floor(given, config):
        return None
    return Remedy(config, Knob.SPECULATIVE, f"few sequences per step ({batch:.1f}): verifying {k} drafted tokens "
                  "is ~free")


def _keeps_throughput_floor(given: PolicyInput, config: RuntimeConfig) -> bool:
    """Predicted decode throughput at the window's batch with speculation, against the floor."""
    floor = given.slo.min_throughput
    if floor is None or config.speculative is None:
        return True
    s = given.snapshot
    batch = max(1, round(s.num_running_mean or 1))
    context = (s.mean_prompt_tokens or 0.0) + (s.mean_generation_tokens or 0.0) / 2
    k, a = config.speculative.num_speculative_tokens, PRIOR_ACCEPTANCE
    tokens_per_step = (1 - a ** (k + 1)) / (1 - a)
    step_s = given.deployment.step_model(config).decode_step_s(batch, context, tokens_per_seq=k + 1)
    return batch * tokens_per_step / step_s * config.replicas >= floor
