"""What a change risks, and the least invasive remedy first.

Remedies are ranked by what they put at stake before what they are predicted to gain: batching, the token budget,
chunked prefill and prefix caching change nothing a user reads and add no GPU; replicas cost GPUs; speculation is
lossless in principle but leans on the engine's verification; 8-bit weights and an fp8 KV cache change the outputs
themselves. An output-altering remedy is first only where the diagnosis says no plain one can close the gap (a TPOT
target below this config's floor, which only the floor movers lower); elsewhere the bottleneck's first engine-knob
remedy goes before it (see `least_invasive_first` for why not every plain one). On
SmolLM2-135M on a 2-core CPU, queueing (1 of 1 running, 5 waiting) was first answered with 8-bit weights (x1.11 TTFT)
before max_num_seqs 1 -> 16 met the SLO (x9) with int8 still on: the order this module fixes.

Once the SLO holds, `reverts` offers every kept output-altering change back, as a trim: kept only if the SLO still
holds without it (measured), so no output-altering change outlives the need that brought it.
"""

from __future__ import annotations

from enum import IntEnum

from slotune.api.tuning import Knob
from slotune.knobs import RuntimeConfig
from slotune.knobs.schema import KVCacheDtype, Quantization
from slotune.policy.inputs import PolicyInput, Remedy


class Risk(IntEnum):
    PLAIN = 0  # batching, token budget, chunked prefill, prefix caching, replicas: outputs unchanged
    SPECULATION = 1  # outputs unchanged in principle; the engine's verification is trusted
    OUTPUT_ALTERING = 2  # weights or KV cache in lower precision


def risk_of(previous: RuntimeConfig, config: RuntimeConfig) -> Risk:
    altered = ((config.quantization is not Quantization.NONE and config.quantization != previous.quantization)
               or (config.kv_cache_dtype is not KVCacheDtype.AUTO and config.kv_cache_dtype != previous.kv_cache_dtype))
    if altered:
        return Risk.OUTPUT_ALTERING
    if config.speculative is not None and config.speculative != previous.speculative:
        return Risk.SPECULATION
    return Risk.PLAIN


def least_invasive_first(remedies: list[Remedy], current: RuntimeConfig) -> list[Remedy]:
    """The first engine-knob remedy (no output altered, no GPU added) moved ahead of every output-altering one; the
    rest keep the bottleneck's order. Moving replicas and speculation ahead of 8-bit weights too ended 3 of 17
    feasible tuner-benchmark scenarios (L4, quality changes allowed) on more GPUs than the oracle's fp8 config, and
    every engine knob ahead of them took median 5 changes to the SLO instead of 1."""
    plain = next((r for r in remedies if risk_of(current, r.config) is Risk.PLAIN
                  and r.config.replicas == current.replicas), None)
    altering = [r for r in remedies if risk_of(current, r.config) is Risk.OUTPUT_ALTERING]
    if plain is None or not altering or remedies.index(plain) < remedies.index(altering[0]):
        return remedies
    rest = [r for r in remedies if r is not plain]
    at = rest.index(altering[0])
    return [*rest[:at], plain, *rest[at:]]


def reverts(given: PolicyInput) -> list[Remedy]:
    """Each output-altering setting of the current config back to the model's own (8-bit weights, then the KV
    cache's precision), for a trim once the SLO holds."""
    c = given.config
    found = []
    if c.quantization is not Quantization.NONE:
        found.append(Remedy(c.with_changes(quantization=Quantization.NONE), Knob.QUANTIZATION,
                            "the SLO holds: the model's own weights again, if it still holds without 8-bit ones"))
    if c.kv_cache_dtype is not KVCacheDtype.AUTO:
        found.append(Remedy(c.with_changes(kv_cache_dtype=KVCacheDtype.AUTO), Knob.KV_CACHE_DTYPE,
                            "the SLO holds: the KV cache in the model's precision again, if it still holds"))
    return found
