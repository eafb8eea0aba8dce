"""The discrete knob space the search baselines and the exhaustive oracle walk, derived from a scenario's bounds.

It holds what a sweep would: max_num_seqs and max_num_batched_tokens on coarse ladders (vLLM auto_tune sweeps these
two), each allowed boolean knob both ways, speculation off or ngram with 4 drafts, quantization off or the
accelerator's 8-bit format when quality changes are allowed, and every replica count in bounds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from slotune.api.tuning import Knob
from slotune.knobs import Quantization, RuntimeConfig, SpeculativeConfig, SpeculativeMethod
from slotune.tunerbench.scenario import Scenario

SEQS_LADDER = (8, 64, 256)
BUDGET_LADDER = (512, 2048, 8192)


@dataclass(frozen=True)
class Dimension:
    knob: Knob
    values: tuple[object, ...]


def dimensions(scenario: Scenario) -> list[Dimension]:
    start, tuning = scenario.start, scenario.tuning
    bounds, knobs = tuning.bounds, set(tuning.knobs)

    def allowed(knob: Knob, values: tuple[object, ...], current: object) -> tuple[object, ...]:
        return tuple(dict.fromkeys(values)) if knob in knobs else (current,)

    seqs = tuple(v for v in SEQS_LADDER if bounds.max_num_seqs.min <= v <= bounds.max_num_seqs.max)
    budgets = tuple(v for v in BUDGET_LADDER
                    if bounds.max_num_batched_tokens.min <= v <= bounds.max_num_batched_tokens.max)
    speculation = SpeculativeConfig(method=SpeculativeMethod.NGRAM, num_speculative_tokens=4)
    fp8 = scenario.deployment.accelerator.fp8_flops_per_s is not None
    quant = (Quantization.NONE, Quantization.FP8 if fp8 else Quantization.INT8)
    quality = tuning.allow_quality_change
    most = bounds.max_replicas if bounds.max_replicas is not None else start.replicas
    return [
        Dimension(Knob.REPLICAS, allowed(Knob.REPLICAS, tuple(range(bounds.min_replicas, most + 1)), start.replicas)),
        Dimension(Knob.MAX_NUM_SEQS, allowed(Knob.MAX_NUM_SEQS, seqs, start.max_num_seqs)),
        Dimension(Knob.MAX_NUM_BATCHED_TOKENS, allowed(Knob.MAX_NUM_BATCHED_TOKENS, budgets,
                                                       start.max_num_batched_tokens)),
        Dimension(Knob.ENABLE_PREFIX_CACHING, allowed(Knob.ENABLE_PREFIX_CACHING, (False, True),
                                                      start.enable_prefix_caching)),
        Dimension(Knob.ENABLE_CHUNKED_PREFILL, allowed(Knob.ENABLE_CHUNKED_PREFILL,
                                                       (True, start.enable_chunked_prefill),
                                                       start.enable_chunked_prefill)),
        Dimension(Knob.SPECULATIVE, allowed(Knob.SPECULATIVE, (None, speculation), start.speculative)),
        Dimension(Knob.QUANTIZATION, allowed(Knob.QUANTIZATION, quant, start.quantization) if quality
                  else (start.quantization,)),
    ]


def config_of(scenario: Scenario, choice: dict[Knob, object]) -> RuntimeConfig:
    """The start config with the chosen knob values (the I/O edge between a search library and RuntimeConfig)."""
    return scenario.start.with_changes(**{knob.value: value for knob, value in choice.items()})


def all_configs(scenario: Scenario) -> list[RuntimeConfig]:
    dims = dimensions(scenario)
    return [config_of(scenario, dict(zip([d.knob for d in dims], values, strict=True)))
            for values in itertools.product(*(d.values for d in dims))]
