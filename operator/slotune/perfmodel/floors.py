"""Floors per configuration: the least TPOT and TTFT a config can reach, and the least any allowed config can.

A floor is one sequence served alone: nothing a batch limit, a token budget or replicas do makes a request faster
than that. It depends on the knobs that change what one step costs or yields: weight and KV precision (bytes read per
step) and speculative decoding (tokens verified and yielded per step). Speculation's yield depends on how often
drafts are accepted, which only measuring the workload tells; before any measurement the prior stands in.
`reachable_tpot_ms` is the least floor over every combination of those knobs the spec allows: a target below it is out
of reach of any tuning, a target below only the current config's floor is a matter of turning the right knob.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from slotune.api.tuning import Knob, TuningSpec
from slotune.knobs import KVCacheDtype, Quantization, RuntimeConfig, SpeculativeConfig, SpeculativeMethod
from slotune.perfmodel.deployment import Deployment

PRIOR_ACCEPTANCE = 0.5  # per-token draft acceptance assumed before speculation was ever measured on this workload
DRAFT_MODEL_COST_PER_TOKEN = 0.1  # a draft model step costs about this share of a batch-1 target step (~10x smaller)


def expected_tokens_per_step(acceptance: float, num_drafts: int) -> float:
    """Tokens a verification step yields per sequence when each drafted token is accepted with probability a,
    independently, until the first rejection: (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023, eq. 1)."""
    a = min(max(acceptance, 0.0), 0.999)
    return (1 - a ** (num_drafts + 1)) / (1 - a)


def per_token_acceptance(accepted_per_drafted: float, num_drafts: int) -> float:
    """Invert the runtime's accepted / drafted tokens (vLLM's spec_decode acceptance rate) to the per-token a of
    `expected_tokens_per_step`: accepted / drafted = (a + a^2 + ... + a^k) / k, increasing in a, solved by
    bisection."""
    target = min(max(accepted_per_drafted, 0.0), 0.999)
    low, high = 0.0, 0.999
    for _ in range(40):
        mid = (low + high) / 2
        if sum(mid ** i for i in range(1, num_drafts + 1)) / num_drafts < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def decode_token_s(deployment: Deployment, config: RuntimeConfig, batch: int, context_tokens: float,
                   acceptance: float = PRIOR_ACCEPTANCE) -> float:
    """Seconds between a sequence's tokens in decode steps of `batch` sequences: one step, or with speculation one
    verification step of k + 1 tokens (plus the draft model's steps) over the tokens it yields."""
    step = deployment.step_model(config)
    spec = config.speculative
    if spec is None:
        return step.decode_step_s(batch, context_tokens)
    k = spec.num_speculative_tokens
    verify_s = step.decode_step_s(batch, context_tokens, tokens_per_seq=k + 1)
    if spec.method is SpeculativeMethod.DRAFT_MODEL:
        verify_s += DRAFT_MODEL_COST_PER_TOKEN * k * step.decode_step_s(1, 0)
    return verify_s / expected_tokens_per_step(acceptance, k)


@dataclass(frozen=True)
class Floors:
    """What one config can at best do, in milliseconds, and what the best allowed config can."""

    tpot_ms: float  # one sequence decoding alone at the window's mean context, this config
    ttft_ms: float  # the window's mean prompt prefilled alone, shared prefix reused if caching could
    reachable_tpot_ms: float  # the least TPOT floor over every allowed precision and speculation setting
    reachable_ttft_ms: float
    best_config: RuntimeConfig  # the config with the least TPOT floor


def floors(deployment: Deployment, config: RuntimeConfig, prompt_tokens: int, context_tokens: float,
           cached_share: float, acceptance: float, variants: list[RuntimeConfig] | None = None) -> Floors:
    """Floors of `config` and of the best of `variants` (configs differing in floor-moving knobs)."""
    def tpot(c: RuntimeConfig) -> float:
        return decode_token_s(deployment, c, 1, context_tokens, acceptance) * 1000.0

    def ttft(c: RuntimeConfig) -> float:
        cached = round(prompt_tokens * cached_share) if c.enable_prefix_caching else 0
        return deployment.step_model(c).prefill_s(prompt_tokens, min(cached, prompt_tokens - 1)) * 1000.0

    candidates = [config, *(variants or [])]
    best = min(candidates, key=tpot)
    return Floors(tpot(config), ttft(config), tpot(best), min(ttft(c) for c in candidates), best)


def speculation_options(config: RuntimeConfig, tuning: TuningSpec, draft_model: str | None,
                        num_drafts: int) -> list[SpeculativeConfig]:
    """The speculative configs the spec allows: each allowed method, draft_model only with a draft checkpoint."""
    if Knob.SPECULATIVE not in tuning.knobs:
        return []
    bounds = tuning.bounds.num_speculative_tokens
    k = min(max(num_drafts, bounds.min), bounds.max)
    found = []
    for method in tuning.bounds.speculative_methods:
        if method is SpeculativeMethod.DRAFT_MODEL and not draft_model:
            continue  # nothing to draft with: the runtime would refuse it
        draft = draft_model if method is SpeculativeMethod.DRAFT_MODEL else None
        found.append(SpeculativeConfig(method=method, num_speculative_tokens=k, draft_model=draft))
    return found


def floor_variants(config: RuntimeConfig, tuning: TuningSpec, deployment: Deployment,
                   draft_model: str | None = None) -> list[RuntimeConfig]:
    """`config` with every allowed combination of weight precision, KV precision, speculation (drafts anywhere in
    the allowed range) and prefix caching (it moves the TTFT floor), that would start."""
    quality = tuning.allow_quality_change
    quants = [config.quantization]
    if quality and Knob.QUANTIZATION in tuning.knobs:
        quants.append(Quantization.FP8 if deployment.accelerator.fp8_flops_per_s is not None else Quantization.INT8)
    kvs = [config.kv_cache_dtype]
    if quality and Knob.KV_CACHE_DTYPE in tuning.knobs:
        kvs.append(KVCacheDtype.FP8)
    bounds = tuning.bounds.num_speculative_tokens
    specs: list[SpeculativeConfig | None] = [config.speculative]
    if Knob.SPECULATIVE in tuning.knobs:
        specs.append(None)
        for k in range(bounds.min, bounds.max + 1):
            specs += speculation_options(config, tuning, draft_model, k)
    prefixes = [config.enable_prefix_caching, *([True] if Knob.ENABLE_PREFIX_CACHING in tuning.knobs else [])]
    found = []
    for quant, kv, spec, prefix in itertools.product(dict.fromkeys(quants), dict.fromkeys(kvs), specs,
                                                     dict.fromkeys(prefixes)):
        variant = config.model_copy(update={"quantization": quant, "kv_cache_dtype": kv, "speculative": spec,
                                            "enable_prefix_caching": prefix})
        if variant != config and deployment.startup_error(variant) is None:
            found.append(variant)
    return found
