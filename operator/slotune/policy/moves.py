"""Single-knob moves, each sized for the window at hand, or None where the knob cannot help (already set, out of
bounds, not allowed by the spec, predicted to break the throughput floor)."""

from __future__ import annotations

from dataclasses import dataclass

from slotune.api.tuning import Knob
from slotune.knobs import Quantization, RuntimeConfig
from slotune.perfmodel import capacity
from slotune.perfmodel.floors import decode_token_s, expected_tokens_per_step, speculation_options
from slotune.policy.inputs import PolicyInput, Remedy
from slotune.policy.sizing import NEAR_MISS, acceptance_of, max_replicas, replicas_for_load, tpot_target, worst_miss
from slotune.snapshot import LatencyMetric

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
    """Chunked prefill on, at the first budget of `chunk_budgets` not tried yet. Each remedy that turns it on does so
    to shorten the steps decodes wait behind, and a 2048-token chunk may still be too long a step: rolled back
    there, the knob used to be given up, and the loop went on with budgets chunked prefill off cannot have, where
    256-512 tokens met the SLO."""
    c = given.config
    if c.enable_chunked_prefill:
        return None
    budgets = chunk_budgets(given)
    configs = [c.with_changes(enable_chunked_prefill=True, max_num_batched_tokens=b) for b in budgets]
    at = next((i for i, config in enumerate(configs) if config.key() not in given.excluded_keys), 0)
    tried = f"; {budgets[at - 1]}-token chunks were tried" if at else ""
    return Remedy(configs[at], Knob.ENABLE_CHUNKED_PREFILL, f"{why}{tried}" if why else why, target)


def chunk_budgets(given: PolicyInput) -> list[int]:
    """The budgets chunked prefill is tried at, in order: 2048 tokens (the current budget where smaller), then
    halves down to 256 (within the bounds), shorter steps for the decodes each time."""
    current, bounds = given.config.max_num_batched_tokens, given.tuning.bounds.max_num_batched_tokens
    budgets = [max(min(current, 2048), bounds.min)]
    while budgets[-1] // 2 >= max(bounds.min, 256):
        budgets.append(budgets[-1] // 2)
    return budgets


def replicas_remedy(given: PolicyInput, why: str) -> Remedy | None:
    """Replicas the capacity model sizes for the load; one more where the window only just missed (the model errs
    up to 2x high, and a count that nearly meets the SLO needs little: the jump would shed goodput per replica and
    leave the replicas between untried, as trims never revisit a count they passed)."""
    c = given.config
    most = max_replicas(given)
    needed = replicas_for_load(given, c)
    clear_miss = worst_miss(given) > NEAR_MISS
    sized = needed if clear_miss else c.replicas + 1
    wanted = min(max(c.replicas + 1, sized), most)
    if wanted <= c.replicas:
        return None
    # A count tried and rolled back is not the end while the window still asks for more replicas (the model's
    # count is above this one, or the miss is too large for a near-miss step): the next larger untried count. An
    # overloaded replica's queue drains into the next window and can make one more replica measure worse.
    if clear_miss or needed > c.replicas:
        wanted = next((n for n in range(wanted, most + 1)
                       if c.with_changes(replicas=n).key() not in given.excluded_keys), wanted)
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
    by reading weights, not by compute, at this batch (small batches, low-bandwidth accelerators). The yield per
    step comes from the workload's measured acceptance (the prior before any measurement), so the number of drafts is
    the one with the best predicted speedup. Proposed only if that speedup is worth it and the throughput floor still
    holds; draft_model only with spec.model.draftModel."""
    c, floor = given.config, given.slo.min_throughput
    if c.speculative is not None:
        return None
    best: tuple[SpeculationEstimate, RuntimeConfig] | None = None
    bounds = given.tuning.bounds.num_speculative_tokens
    for k in range(bounds.min, bounds.max + 1):
        for option in speculation_options(c, given.tuning, given.draft_model, k):
            config = c.with_changes(speculative=option.model_dump())
            predicted = speculation_estimate(given, config, batch)
            if best is None or predicted.speedup > best[0].speedup:
                best = (predicted, config)
    if best is None:
        return None
    predicted, config = best
    if predicted.speedup < MIN_SPECULATION_SPEEDUP or (
            floor is not None and predicted.tokens_per_s * c.replicas < floor):
        return None
    assert config.speculative is not None
    return Remedy(config, Knob.SPECULATIVE, f"decode is bound by weight reads at {batch:.1f} sequences per step: "
                  f"verifying {config.speculative.num_speculative_tokens} drafted tokens costs "
                  f"x{predicted.step_cost:.2f} a step, a predicted x{predicted.speedup:.1f} per token at "
                  f"{_acceptance_source(given)}")


def unspeculate(given: PolicyInput) -> Remedy | None:
    """Speculation off where the acceptance measured under it makes it a loss (each token costs more than without
    drafts): the text stopped being predictable, or never was."""
    c = given.config
    if c.speculative is None or given.snapshot.spec_acceptance_rate is None:
        return None
    plain = c.with_changes(speculative=None)
    batch = given.snapshot.num_running_mean or 1.0
    predicted = speculation_estimate(given, c, batch, plain)
    if predicted.speedup >= 1.0:
        return None
    return Remedy(plain, Knob.SPECULATIVE, f"measured draft acceptance {given.snapshot.spec_acceptance_rate:.2f} "
                  f"makes speculation a loss: a predicted x{predicted.speedup:.2f} per token at {batch:.1f} "
                  "sequences per step", LatencyMetric.TPOT, revisit=True)


def _acceptance_source(given: PolicyInput) -> str:
    a = acceptance_of(given)
    measured = given.spec_acceptance is not None or (
        given.config.speculative is not None and given.snapshot.spec_acceptance_rate is not None)
    return f"measured acceptance {a:.2f}" if measured else f"a prior acceptance of {a:.2f} (not measured yet)"


@dataclass(frozen=True)
class SpeculationEstimate:
    speedup: float  # tokens per second with speculation / without
    step_cost: float  # step time with / without
    tokens_per_s: float  # one replica's decode throughput with speculation


def speculation_estimate(given: PolicyInput, config: RuntimeConfig, batch: float,
                         plain: RuntimeConfig | None = None) -> SpeculationEstimate:
    """Speculation at `batch` sequences: the expected tokens a step yields at the workload's acceptance,
    (1 - a^(k+1)) / (1 - a), against the roofline's cost of verifying k + 1 tokens per sequence (and drafting them,
    for a draft model). `plain` is the config without speculation (default: the current one)."""
    assert config.speculative is not None
    b, context = max(1, round(batch)), given.snapshot.mean_decode_context_tokens
    a, k = acceptance_of(given), config.speculative.num_speculative_tokens
    plain_s = decode_token_s(given.deployment, plain or given.config, b, context)
    per_token_s = decode_token_s(given.deployment, config, b, context, a)
    tokens_per_step = expected_tokens_per_step(a, k)
    return SpeculationEstimate(plain_s / per_token_s, per_token_s * tokens_per_step / plain_s, b / per_token_s)
