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
holds without it (measured), so no output-altering change outlives the need that brought it. Speculation is offered
back too, last, and only where the step model, scaled to the TPOT measured with it, predicts the TPOT targets hold
without it with SPEC_REVERT_ROOM to spare: in the tuner benchmark, chunked prefill at 256 tokens met the SLO alone
on two scenarios where speculation stayed on for good; where only speculation reaches TPOT, trying to give it back
would cost users a missed window for nothing.
"""

from __future__ import annotations

from enum import IntEnum

from slotune.api.tuning import Knob
from slotune.knobs import RuntimeConfig
from slotune.knobs.schema import KVCacheDtype, Quantization
from slotune.perfmodel.floors import PRIOR_ACCEPTANCE, decode_token_s
from slotune.policy.inputs import PolicyInput, Remedy
from slotune.snapshot import LatencyMetric

SPEC_REVERT_ROOM = 0.8  # the TPOT predicted without speculation must stay under this share of each target


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
    cache's precision, then speculation where the model predicts TPOT holds without it), for a trim once the SLO
    holds."""
    c = given.config
    found = []
    if c.quantization is not Quantization.NONE:
        found.append(Remedy(c.with_changes(quantization=Quantization.NONE), Knob.QUANTIZATION,
                            "the SLO holds: the model's own weights again, if it still holds without 8-bit ones"))
    if c.kv_cache_dtype is not KVCacheDtype.AUTO:
        found.append(Remedy(c.with_changes(kv_cache_dtype=KVCacheDtype.AUTO), Knob.KV_CACHE_DTYPE,
                            "the SLO holds: the KV cache in the model's precision again, if it still holds"))
    if c.speculative is not None and _tpot_holds_without_speculation(given):
        found.append(Remedy(c.with_changes(speculative=None), Knob.SPECULATIVE,
                            "the SLO holds: decoding without speculation again, predicted to hold without it"))
    return found


def _tpot_holds_without_speculation(given: PolicyInput) -> bool:
    """Every TPOT target, measured with speculation and scaled by the step model's ratio of token times without
    and with it (at the measured batch, context and acceptance), still has SPEC_REVERT_ROOM to spare."""
    c, s = given.config, given.snapshot
    batch = max(round(s.num_running_mean or 1.0), 1)
    context = s.mean_decode_context_tokens
    acceptance = given.spec_acceptance if given.spec_acceptance is not None else PRIOR_ACCEPTANCE
    with_spec = decode_token_s(given.deployment, c, batch, context, acceptance)
    ratio = decode_token_s(given.deployment, c.with_changes(speculative=None), batch, context) / max(with_spec, 1e-12)
    for target in given.slo.targets():
        if target.metric is not LatencyMetric.TPOT:
            continue
        measured = s.tpot.at(target.percentile)
        if measured is None or measured * ratio > SPEC_REVERT_ROOM * target.target_ms:
            return False
    return True
