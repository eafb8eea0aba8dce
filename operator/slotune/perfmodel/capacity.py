"""How much load one replica carries under a config: utilisation and the replicas a load needs.

A request occupies one batch slot for its whole decode, so at an effective batch B a replica decodes at B / step(B)
tokens per second; prefill is compute work that overlaps bandwidth-bound decode steps. Utilisation is then
rho = rate_per_replica * max(output_tokens * step(B) / B, prefill_s + decode compute), the busy fraction of an
M/G/1-like server; queueing delay grows as 1 / (1 - rho), so a replica is sized
for rho <= TARGET_UTILIZATION. The effective batch is bounded by max_num_seqs, by the KV cache, and (when a TPOT
target is given) by the largest batch whose step still meets it. Under speculative decoding a decode "step" is one
verification step over the tokens it yields at the workload's draft acceptance (`floors.decode_token_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slotune.knobs import RuntimeConfig
from slotune.knobs.schema import KNOBS_BY_NAME
from slotune.perfmodel.deployment import Deployment
from slotune.perfmodel.floors import PRIOR_ACCEPTANCE, decode_token_s
from slotune.perfmodel.roofline import StepShape

TARGET_UTILIZATION = 0.7
MOST_SEQS = KNOBS_BY_NAME["max_num_seqs"].bounds.maximum  # type: ignore[union-attr]  # the schema's largest
BATCH_STEP_SLACK = 1.25  # a batch may lengthen the mean step this much over batch 1's, whatever the TPOT target


@dataclass(frozen=True)
class Load:
    """The offered load, from a window or a workload spec."""

    request_rate_per_s: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    cached_prompt_share: float = 0.0  # fraction of prompt tokens a prefix cache can skip
    spec_acceptance: float = PRIOR_ACCEPTANCE  # per-token draft acceptance on this text (speculative configs)


def effective_batch(deployment: Deployment, config: RuntimeConfig, load: Load, tpot_target_ms: float | None) -> int:
    """Batch bounded by max_num_seqs, the KV cache and the TPOT target (see `mean_step_s`)."""
    context = load.mean_prompt_tokens + load.mean_output_tokens / 2
    batch = max(1, min(config.max_num_seqs, int(deployment.kv_capacity_tokens(config) / max(context, 1.0))))
    if tpot_target_ms is not None:
        # Prefill chunks set a floor under the step that no batch limit removes (the token budget does): bound the
        # batch only by what it adds to that floor.
        allowed_s = max(0.8 * tpot_target_ms / 1000.0, BATCH_STEP_SLACK * mean_step_s(deployment, config, load, 1))
        while batch > 1 and mean_step_s(deployment, config, load, batch) > allowed_s:
            batch = batch * 3 // 4
    return batch


def mean_step_s(deployment: Deployment, config: RuntimeConfig, load: Load, batch: int) -> float:
    """Mean time between a sequence's tokens: a replica spends the prefill share p of its time in steps that carry
    a prompt chunk (max of the chunk's compute and the decode's bandwidth) and the rest in plain decode steps, so
    steps per second are p / t_mixed + (1 - p) / t_decode."""
    step = deployment.step_model(config)
    context = load.mean_prompt_tokens + load.mean_output_tokens / 2
    decode_s = decode_token_s(deployment, config, batch, context, load.spec_acceptance)
    chunk = min(config.max_num_batched_tokens, max(1, round(load.mean_prompt_tokens)))
    mixed_s = step.step_time_s(StepShape(num_prefill_tokens=chunk, prefill_attention_tokens=chunk * chunk / 2,
                                         num_decode_seqs=batch, decode_context_tokens=batch * context))
    share = min(prefill_share(deployment, config, load), 1.0)
    return 1.0 / (share / mixed_s + (1.0 - share) / decode_s)


def prefill_share(deployment: Deployment, config: RuntimeConfig, load: Load) -> float:
    """Fraction of one replica's time spent prefilling at this load."""
    return load.request_rate_per_s / config.replicas * _prefill_s(deployment, config, load)


def _prefill_s(deployment: Deployment, config: RuntimeConfig, load: Load) -> float:
    prompt = max(1, round(load.mean_prompt_tokens))
    cached = round(prompt * load.cached_prompt_share) if config.enable_prefix_caching else 0
    return deployment.step_model(config).prefill_s(prompt, min(cached, prompt - 1), config.max_num_batched_tokens)


def service_s(deployment: Deployment, config: RuntimeConfig, load: Load, tpot_target_ms: float | None) -> float:
    """Busy seconds one request costs a replica."""
    step = deployment.step_model(config)
    batch = effective_batch(deployment, config, load, tpot_target_ms)
    context = load.mean_prompt_tokens + load.mean_output_tokens / 2
    decode_s = load.mean_output_tokens * decode_token_s(deployment, config, batch, context,
                                                        load.spec_acceptance) / batch
    # Chunked prefill rides along in decode steps: bandwidth-bound decode leaves compute idle for prompt tokens, so
    # the two overlap and the replica is busy for whichever is larger (a roofline on throughput).
    decode_compute_s = load.mean_output_tokens * step.cost(StepShape(num_decode_seqs=1)).compute_s / step.eff.compute
    return max(decode_s, _prefill_s(deployment, config, load) + decode_compute_s)


def utilization(deployment: Deployment, config: RuntimeConfig, load: Load, tpot_target_ms: float | None) -> float:
    return load.request_rate_per_s / config.replicas * service_s(deployment, config, load, tpot_target_ms)


def replicas_needed(deployment: Deployment, config: RuntimeConfig, load: Load, tpot_target_ms: float | None) -> int:
    per_request = service_s(deployment, config, load, tpot_target_ms)
    return max(1, math.ceil(load.request_rate_per_s * per_request / TARGET_UTILIZATION))


def batch_limit(deployment: Deployment, config: RuntimeConfig, load: Load, tpot_target_ms: float | None) -> int:
    """The largest batch the KV cache holds whose decode step still leaves headroom under the TPOT target."""
    unbound = config.with_changes(max_num_seqs=MOST_SEQS)  # no limit on the batch but the KV cache's
    return effective_batch(deployment, unbound, load, tpot_target_ms)


def budget_limit(deployment: Deployment, config: RuntimeConfig, tpot_target_ms: float | None, batch: int,
                 context_tokens: float, floor: int = 256) -> int:
    """The largest power-of-two token budget whose full prefill chunk, mixed with `batch` decodes, fits one step
    under the TPOT target (a longer step stalls every running decode for that long)."""
    if tpot_target_ms is None:
        return 16384
    step = deployment.step_model(config)
    budget = 16384
    while budget > floor:
        shape_s = step.step_time_s(_mixed(budget, batch, context_tokens))
        if shape_s * 1000.0 <= tpot_target_ms:
            break
        budget //= 2
    return budget


def _mixed(prefill_tokens: int, batch: int, context_tokens: float) -> StepShape:
    return StepShape(num_prefill_tokens=prefill_tokens, prefill_attention_tokens=prefill_tokens * prefill_tokens / 2,
                     num_decode_seqs=batch, decode_context_tokens=batch * context_tokens)
