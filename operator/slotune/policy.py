"""Policy: from a diagnosis to the one change to try next, or to Infeasible with what would be needed.

Each bottleneck has an ordered list of remedies (DESIGN.md workflow step 2); the first one the spec allows, within the
knob bounds, that was never tried before (kept, rolled back or crashed: `excluded_keys`), is proposed with the metric
it targets and the effect the roofline expects. Never revisiting a config is the hysteresis that stops flapping.
Steps are sized with the capacity model (replicas a load needs, batch headroom) so few changes reach the SLO.
Quantization is proposed only when the spec allows quality changes, and before speculation on low-bandwidth
accelerators; speculation only at low batch and never when its predicted throughput cost breaks the throughput floor.
When nothing is left, or the roofline puts a target below what any allowed knob can reach, the answer is Infeasible
with the closest configuration and what would be needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

from slotune.api.tuning import Knob, TuningSpec
from slotune.diagnosis import Bottleneck, Diagnosis
from slotune.knobs import Quantization, RuntimeConfig, SpeculativeConfig
from slotune.loadgen.workload import WorkloadSpec
from slotune.metrics.snapshot import LatencyMetric, MetricsSnapshot
from slotune.perfmodel import capacity
from slotune.perfmodel.accelerators import ACCELERATORS
from slotune.perfmodel.deployment import Deployment
from slotune.slo import SLOSpec

LOW_BANDWIDTH_BYTES_PER_S = 1e12  # below this, weights dominate decode: quantize before speculating
SPECULATION_MAX_BATCH = 8  # verification is ~free only while decode stays bandwidth bound
PRIOR_ACCEPTANCE = 0.5  # per-token acceptance assumed before speculation was ever measured
MAX_MOVE_ATTEMPTS = 2  # a knob setting rolled back this often is not proposed again (hysteresis)
BATCH_BINDS_SHARE = 0.5  # mean running sequences at or above this share of max_num_seqs: the limit binds


@dataclass(frozen=True)
class Proposal:
    config: RuntimeConfig
    knob: Knob
    change: str  # e.g. "max_num_seqs 4 -> 64"
    reason: str
    target_metric: LatencyMetric
    target_percentile: int
    trim: bool = False  # a cost-saving change made while the SLO holds: kept only if it still holds after


@dataclass(frozen=True)
class Infeasible:
    closest: RuntimeConfig
    reason: str
    needs: tuple[str, ...]


@dataclass(frozen=True)
class PolicyInput:
    """Everything the policy may look at besides the diagnosis."""

    config: RuntimeConfig
    snapshot: MetricsSnapshot
    slo: SLOSpec
    tuning: TuningSpec
    deployment: Deployment
    excluded_keys: frozenset[str] = frozenset()
    rolled_back_moves: tuple[str, ...] = ()  # see move_key; a move is tried at most MAX_MOVE_ATTEMPTS times
    closest: RuntimeConfig | None = None
    workload: WorkloadSpec | None = None
    prepared_replicas: int | None = None  # a headroom change was just kept to make this replica count hold


def propose(diagnosis: Diagnosis, given: PolicyInput) -> Proposal | Infeasible:
    primary = diagnosis.primary
    if primary is None:
        raise ValueError("nothing to propose: the window meets every SLO target")
    for config, knob, why, target in _remedies(diagnosis, given):
        if _admissible(config, knob, given):
            metric = target or primary.target.metric
            percentile = _percentile_of(given.slo, metric, primary.target.percentile) if target else (
                primary.target.percentile)
            return Proposal(config, knob, _describe_change(given.config, config, knob), why, metric, percentile)
    return _infeasible(diagnosis, given)


def propose_trim(given: PolicyInput) -> Proposal | None:
    """Once every SLO holds: make replicas cheaper (prefix caching, 8-bit weights where allowed), then use fewer of
    them, down to what the capacity model says the load needs. Each step is kept only if the SLO still holds."""
    c, bounds = given.config, given.tuning.bounds
    efficiency = _efficiency(given) if c.replicas > bounds.min_replicas else []
    needed = max(bounds.min_replicas, _replicas_for_load(given, c))
    if any(move.startswith("replicas=") for move in given.rolled_back_moves):
        needed = c.replicas - 1  # the model's count broke the SLO once: step down one replica at a time
    fewer = [Remedy(c.with_changes(replicas=n), Knob.REPLICAS, "the SLO holds with capacity to spare")
             for n in dict.fromkeys((needed, c.replicas - 1)) if bounds.min_replicas <= n < c.replicas]
    candidates = [*efficiency, *fewer]
    prepared = given.prepared_replicas
    if prepared is not None and bounds.min_replicas <= prepared < c.replicas:
        retry = Remedy(c.with_changes(replicas=prepared), Knob.REPLICAS, f"headroom added for {prepared} replicas")
        candidates = [retry, *candidates]
    target = given.slo.targets()[0]
    for config, knob, why, _ in candidates:
        if _admissible(config, knob, given):
            return Proposal(config, knob, _describe_change(c, config, knob), why, target.metric, target.percentile,
                            trim=True)
    return None


def propose_headroom(diagnosis: Diagnosis, failed: PolicyInput, current: RuntimeConfig) -> Proposal | None:
    """A trim to fewer replicas broke the SLO. The remedy the failed window calls for at the fewer replicas (`failed`
    describes that config and window), made here at the current count where the SLO holds, so that the next try at
    fewer replicas starts with it. Kept only if the SLO still holds, like every trim."""
    if diagnosis.primary is None:
        return None
    here = replace(failed, config=current)
    target = failed.slo.targets()[0]
    for config, knob, why, _ in _remedies(diagnosis, failed):
        if knob is Knob.REPLICAS:
            continue
        moved = current.with_changes(**{name: getattr(config, name) for name in failed.config.changed_knobs(config)})
        if _admissible(moved, knob, here):
            return Proposal(moved, knob, _describe_change(current, moved, knob),
                            f"{why} (seen at {failed.config.replicas} replicas, which broke the SLO)", target.metric,
                            target.percentile, trim=True)
    return None


def _efficiency(given: PolicyInput) -> list[Remedy]:
    """Changes that let each replica carry more, so that fewer replicas can follow; gentle steps (x2), since each
    is kept only if the SLO still holds."""
    c, s, bounds = given.config, given.snapshot, given.tuning.bounds
    found = [r for r in (_enable_prefix_cache(given),) if r]
    # With one replica fewer, each remaining replica runs r / (r - 1) times the batch: raise the limit if it would bind.
    scale = c.replicas / max(c.replicas - 1, 1)
    batch_binds = (s.num_running_mean or 0.0) * scale >= 0.5 * c.max_num_seqs
    if batch_binds and (s.kv_cache_usage or 0.0) < 0.85 and 2 * c.max_num_seqs <= bounds.max_num_seqs.max:
        found.append(Remedy(c.with_changes(max_num_seqs=2 * c.max_num_seqs), Knob.MAX_NUM_SEQS,
                            "room for larger batches per replica"))
    budget = min(2 * c.max_num_batched_tokens, bounds.max_num_batched_tokens.max, _budget_cap(given))
    if budget > c.max_num_batched_tokens:
        found.append(Remedy(c.with_changes(max_num_batched_tokens=budget), Knob.MAX_NUM_BATCHED_TOKENS,
                            "fewer, larger prefill steps"))
    quant = _quantize(given, "8-bit weights serve more per replica")
    return found + [r for r in (quant,) if r]


# -- remedies per bottleneck ----------------------------------------------------------------------------------------

class Remedy(NamedTuple):
    config: RuntimeConfig
    knob: Knob
    why: str
    target: LatencyMetric | None = None  # the metric it should improve, when not the worst violated one


def _percentile_of(slo: SLOSpec, metric: LatencyMetric, fallback: int) -> int:
    return max((t.percentile for t in slo.targets() if t.metric is metric), default=fallback)


def _remedies(diagnosis: Diagnosis, given: PolicyInput) -> list[Remedy]:
    by_bottleneck = {
        Bottleneck.CAPACITY: _capacity, Bottleneck.PREFIX_CACHE: _prefix_cache, Bottleneck.PREFILL: _prefill,
        Bottleneck.PREFILL_INTERFERENCE: _interference, Bottleneck.DECODE_BANDWIDTH: _decode,
    }
    remedies = by_bottleneck[diagnosis.bottleneck](given)
    if diagnosis.out_of_reach:  # below the floor of these weights: only changing the weights' cost can help
        return [r for r in remedies if r[1] in (Knob.QUANTIZATION, Knob.SPECULATIVE, Knob.ENABLE_PREFIX_CACHING)]
    return remedies + _fallbacks(diagnosis.bottleneck, given)


def _fallbacks(bottleneck: Bottleneck, given: PolicyInput) -> list[Remedy]:
    """Plain steps the capacity model does not predict to be enough, tried (and verified) before giving up: the
    model is approximate, and a wrong Infeasible costs more than a rolled-back change."""
    c, bounds, s = given.config, given.tuning.bounds, given.snapshot
    first_token = bottleneck in (Bottleneck.CAPACITY, Bottleneck.PREFILL, Bottleneck.PREFIX_CACHE)
    found: list[Remedy] = []
    roomy = 2 * c.max_num_seqs <= bounds.max_num_seqs.max and (s.kv_cache_usage or 0.0) < 0.85
    if first_token and roomy and _batch_binds(given):
        found.append(Remedy(c.with_changes(max_num_seqs=2 * c.max_num_seqs), Knob.MAX_NUM_SEQS, "more batch headroom"))
    if first_token and 2 * c.max_num_batched_tokens <= min(bounds.max_num_batched_tokens.max, 8192):
        found.append(Remedy(c.with_changes(max_num_batched_tokens=2 * c.max_num_batched_tokens),
                      Knob.MAX_NUM_BATCHED_TOKENS, "more prompt tokens per step"))
    tpot_target, tpot = _tpot_target(given.slo), s.tpot.p99_ms or 0.0
    # TPOT is tight when it is near its target, or when a larger batch was rolled back before (it broke TPOT).
    tight = tpot_target is not None and (tpot >= 0.8 * tpot_target or _batch_failed(given))
    if first_token and tight and c.max_num_batched_tokens // 2 >= max(bounds.max_num_batched_tokens.min, 256):
        found.append(Remedy(c.with_changes(max_num_batched_tokens=c.max_num_batched_tokens // 2),
                            Knob.MAX_NUM_BATCHED_TOKENS, "TPOT is near its target: shorter prefill chunks make room "
                            "for a larger batch next", LatencyMetric.TPOT))
    if not first_token and c.max_num_batched_tokens // 2 >= max(bounds.max_num_batched_tokens.min, 256):
        found.append(Remedy(c.with_changes(max_num_batched_tokens=c.max_num_batched_tokens // 2),
                      Knob.MAX_NUM_BATCHED_TOKENS, "shorter prefill chunks between decode steps"))
    if not first_token and c.max_num_seqs // 2 >= bounds.max_num_seqs.min and (s.num_running_mean or 0) > 4:
        found.append(Remedy(c.with_changes(max_num_seqs=c.max_num_seqs // 2), Knob.MAX_NUM_SEQS,
                      "smaller batches make each step shorter"))
    quant = _quantize(given, "8-bit weights: less to read per step, faster tensor cores")
    replicas = _replicas_remedy(given, "more replicas share the load")
    return found + [r for r in (quant, replicas) if r]


def _capacity(given: PolicyInput) -> list[Remedy]:
    c, s = given.config, given.snapshot
    running, waiting = s.num_running_mean or 0.0, s.num_waiting_mean or 0.0
    remedies: list[Remedy] = []
    kv_room = (s.kv_cache_usage or 0.0) < 0.85 and s.num_preemptions == 0
    limit = min(capacity.batch_limit(given.deployment, c, _load(given), _tpot_target(given.slo)),
                given.tuning.bounds.max_num_seqs.max)
    if kv_room and _batch_binds(given) and 1.5 * c.max_num_seqs <= limit:
        seqs = max(min(2 * c.max_num_seqs, limit), _pow2_at_most(limit))
        remedies.append(Remedy(c.with_changes(max_num_seqs=seqs), Knob.MAX_NUM_SEQS,
                         f"queueing with {running:.1f} of {c.max_num_seqs} running and {waiting:.1f} waiting; the "
                         f"KV cache and the TPOT target allow batches of ~{limit}"))
        # Smaller steps toward it, tried only once the sized step was rolled back (it broke another target):
        # the model's limit was optimistic, and the batch that meets every target lies in between. Not without
        # chunked prefill: there a larger batch breaks TPOT through whole-prompt stalls, whatever its size.
        smaller = seqs // 2
        while c.enable_chunked_prefill and smaller >= max(2, int(1.5 * c.max_num_seqs)):
            remedies.append(Remedy(c.with_changes(max_num_seqs=smaller), Knob.MAX_NUM_SEQS,
                                   f"queueing with {c.max_num_seqs} running at most; max_num_seqs {seqs} was rolled "
                                   f"back, so a smaller step"))
            smaller //= 2
    replicas = _replicas_remedy(given, "queueing: the load needs more replicas")
    if replicas and _needs_more_replicas(given):
        remedies.insert(0, replicas)
    quant = _quantize(given, "low-bandwidth accelerator: 8-bit weights nearly double what each replica decodes")
    if quant and given.deployment.accelerator.memory_bandwidth_bytes_per_s < LOW_BANDWIDTH_BYTES_PER_S:
        remedies.insert(0, quant)
    budget = _budget_up(given, "a small token budget slows admission")
    remedies += [r for r in (budget, replicas) if r]
    chunked = _chunked_prefill(given, "a larger batch broke TPOT: without chunked prefill every admitted prompt "
                               "stalls all running decodes for its whole prefill", LatencyMetric.TPOT)
    if chunked and _batch_failed(given):
        remedies.insert(0, chunked)
    prefix = _enable_prefix_cache(given)  # costs nothing and cuts every request's prefill work: first
    return [prefix, *remedies] if prefix else remedies


def _batch_failed(given: PolicyInput) -> bool:
    """A larger max_num_seqs was tried and rolled back before (it broke another target, typically TPOT)."""
    return any(move.startswith("max_num_seqs=") for move in given.rolled_back_moves)


def _batch_binds(given: PolicyInput) -> bool:
    """Whether max_num_seqs can be what queues requests: the window ran at least half of it on average. Requests
    waiting while most batch slots stay free wait for something else (prompt compute, whole-prompt prefill steps,
    bursts), and a larger batch only adds decodes to every step."""
    return (given.snapshot.num_running_mean or 0.0) >= BATCH_BINDS_SHARE * given.config.max_num_seqs


def _prefix_cache(given: PolicyInput) -> list[Remedy]:
    c = given.config
    if not c.enable_prefix_caching:
        return [Remedy(c.with_changes(enable_prefix_caching=True), Knob.ENABLE_PREFIX_CACHING,
                 "shared prompt prefixes are recomputed on every request"), *_prefill(given)]
    return _prefill(given)


def _prefill(given: PolicyInput) -> list[Remedy]:
    remedies = [r for r in (_enable_prefix_cache(given), _budget_up(given, "prompts need many steps to prefill"),
                            _quantize(given, "prefill is compute bound: 8-bit weights run on faster tensor cores"),
                            _replicas_remedy(given, "prefill work spread over more replicas")) if r]
    return remedies


def _chunked_prefill(given: PolicyInput, why: str, target: LatencyMetric | None = None) -> Remedy | None:
    c, bounds = given.config, given.tuning.bounds
    if c.enable_chunked_prefill:
        return None
    budget = max(min(c.max_num_batched_tokens, 2048), bounds.max_num_batched_tokens.min)
    return Remedy(c.with_changes(enable_chunked_prefill=True, max_num_batched_tokens=budget),
                  Knob.ENABLE_CHUNKED_PREFILL, why, target)


def _interference(given: PolicyInput) -> list[Remedy]:
    c, bounds = given.config, given.tuning.bounds
    chunked = _chunked_prefill(given, "whole-prompt prefill steps stall every running decode")
    remedies: list[Remedy] = [chunked] if chunked else []
    safe = _budget_cap(given)
    smaller = max(min(c.max_num_batched_tokens // 2, safe), bounds.max_num_batched_tokens.min, 256)
    if smaller < c.max_num_batched_tokens:
        remedies.append(Remedy(c.with_changes(max_num_batched_tokens=smaller), Knob.MAX_NUM_BATCHED_TOKENS,
                         "smaller prefill chunks per step bound the stall each decode sees"))
    replicas = _replicas_remedy(given, "fewer prompts per replica interleave with decodes")
    return [*remedies, *([replicas] if replicas else [])]


def _decode(given: PolicyInput) -> list[Remedy]:
    s, accel = given.snapshot, given.deployment.accelerator
    batch = s.num_running_mean or 1.0
    step = given.deployment.step_model(given.config)
    context = (s.mean_prompt_tokens or 0.0) + (s.mean_generation_tokens or 0.0) / 2
    batch_bound = batch > 4 and step.decode_step_s(round(batch), context) > 1.5 * step.decode_step_s(1, context)
    quant = _quantize(given, "decode is bound by weight bytes per token: 8-bit weights halve them")
    spec = _speculate(given, batch)
    replicas = _replicas_remedy(given, f"{batch:.0f} sequences per step slow each token: spread them")
    ordered = [quant, spec] if accel.memory_bandwidth_bytes_per_s < LOW_BANDWIDTH_BYTES_PER_S else [spec, quant]
    if batch_bound:
        ordered.insert(0, replicas)
    else:
        ordered.append(replicas)
    return [r for r in ordered if r]


# -- single-knob moves --------------------------------------------------------------------------------------------

def _budget_up(given: PolicyInput, why: str) -> Remedy | None:
    c, bounds = given.config, given.tuning.bounds
    budget = min(max(c.max_num_batched_tokens * 4, 2048), bounds.max_num_batched_tokens.max, _budget_cap(given))
    if budget <= c.max_num_batched_tokens:
        return None
    return Remedy(c.with_changes(max_num_batched_tokens=budget), Knob.MAX_NUM_BATCHED_TOKENS,
                  f"{why}; a {budget}-token step still fits the TPOT target")


def _budget_cap(given: PolicyInput) -> int:
    s = given.snapshot
    batch = max(1, round(s.num_running_mean or 1))
    context = (s.mean_prompt_tokens or 0.0) + (s.mean_generation_tokens or 0.0) / 2
    return capacity.budget_limit(given.deployment, given.config, _tpot_target(given.slo), batch, context)


def _enable_prefix_cache(given: PolicyInput) -> Remedy | None:
    c, workload = given.config, given.workload
    shared = workload is not None and bool(workload.shared_prefix_tokens) and bool(workload.shared_prefix_share)
    if c.enable_prefix_caching or not shared:
        return None
    return Remedy(c.with_changes(enable_prefix_caching=True), Knob.ENABLE_PREFIX_CACHING,
            "the workload shares prompt prefixes that are recomputed on every request")


def _replicas_remedy(given: PolicyInput, why: str) -> Remedy | None:
    c = given.config
    most = _max_replicas(given)
    wanted = min(max(c.replicas + 1, _replicas_for_load(given, c)), most)
    if wanted <= c.replicas:
        return None
    return Remedy(c.with_changes(replicas=wanted), Knob.REPLICAS, why)


def _quantize(given: PolicyInput, why: str) -> Remedy | None:
    c, tuning = given.config, given.tuning
    if not tuning.allow_quality_change or c.quantization is not Quantization.NONE:
        return None
    fp8 = given.deployment.accelerator.fp8_flops_per_s is not None
    quant = Quantization.FP8 if fp8 else Quantization.INT8
    return Remedy(c.with_changes(quantization=quant), Knob.QUANTIZATION, why)


def _speculate(given: PolicyInput, batch: float) -> Remedy | None:
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


# -- sizing and checks --------------------------------------------------------------------------------------------

def _load(given: PolicyInput) -> capacity.Load:
    s = given.snapshot
    shared = 0.0
    if given.workload is not None and given.workload.shared_prefix_tokens:
        shared = (given.workload.shared_prefix_share or 0.0) * given.workload.shared_prefix_tokens / max(
            s.mean_prompt_tokens or 1.0, 1.0)
    return capacity.Load(s.request_rate_per_s, s.mean_prompt_tokens or 1.0, s.mean_generation_tokens or 1.0, shared)


def _tpot_target(slo: SLOSpec) -> float | None:
    return None if slo.tpot is None else min(v for v in (slo.tpot.p50, slo.tpot.p95, slo.tpot.p99) if v)


def _replicas_for_load(given: PolicyInput, config: RuntimeConfig) -> int:
    return capacity.replicas_needed(given.deployment, config, _load(given), _tpot_target(given.slo))


def _needs_more_replicas(given: PolicyInput) -> bool:
    """Even with the most batch the bounds allow (and prefix caching where prompts share prefixes), the current
    replicas would be over-utilised."""
    roomy = given.config.with_changes(max_num_seqs=given.tuning.bounds.max_num_seqs.max)
    if _enable_prefix_cache(given) is not None:
        roomy = roomy.with_changes(enable_prefix_caching=True)
    quant = _quantize(given, "")
    if quant is not None:
        roomy = roomy.with_changes(quantization=quant.config.quantization)
    return _replicas_for_load(given, roomy) > given.config.replicas


def _max_replicas(given: PolicyInput) -> int:
    bounds = given.tuning.bounds
    return bounds.max_replicas if bounds.max_replicas is not None else given.config.replicas


def _admissible(config: RuntimeConfig, knob: Knob, given: PolicyInput) -> bool:
    if knob not in given.tuning.knobs or config == given.config or config.key() in given.excluded_keys:
        return False
    if knob is not Knob.REPLICAS and given.rolled_back_moves.count(move_key(given.config, config)) >= \
            MAX_MOVE_ATTEMPTS:
        return False
    error = given.deployment.startup_error(config)
    return error is None


def _pow2_at_most(value: float) -> int:
    return 1 << max(0, math.floor(math.log2(max(value, 1.0))))


def costs_nothing(old: RuntimeConfig, new: RuntimeConfig) -> bool:
    """Turning prefix caching on only skips recomputing tokens already in the cache (vLLM V1 enables it by
    default); every other change trades something away."""
    return old.changed_knobs(new) == {"enable_prefix_caching"} and new.enable_prefix_caching


def move_key(old: RuntimeConfig, new: RuntimeConfig) -> str:
    """The knob values a change sets, e.g. 'max_num_batched_tokens=2048', whatever else differs."""
    return ",".join(f"{k}={_show(getattr(new, k))}" for k in sorted(old.changed_knobs(new)))


def _describe_change(old: RuntimeConfig, new: RuntimeConfig, knob: Knob) -> str:
    parts = []
    for name in sorted(old.changed_knobs(new)):
        before, after = getattr(old, name), getattr(new, name)
        parts.append(f"{name} {_show(before)} -> {_show(after)}")
    return ", ".join(parts) or knob.value


def _show(value: object) -> str:
    if isinstance(value, SpeculativeConfig):
        return f"{value.method.value}x{value.num_speculative_tokens}"
    return "off" if value is None else str(getattr(value, "value", value))


# -- infeasibility ------------------------------------------------------------------------------------------------

def _infeasible(diagnosis: Diagnosis, given: PolicyInput) -> Infeasible:
    closest = given.closest or given.config
    needs = list(_needs(diagnosis, given, closest))
    reason = (f"{diagnosis.bottleneck.value}: no allowed change left that could help "
              f"({', '.join(r.target.name for r in diagnosis.violated)} still violated)")
    if diagnosis.out_of_reach:
        reason = f"{', '.join(diagnosis.out_of_reach)} below what these weights can do on this hardware"
    return Infeasible(closest, reason, tuple(needs))


def _needs(diagnosis: Diagnosis, given: PolicyInput, closest: RuntimeConfig) -> list[str]:
    found = []
    replicas = _replicas_for_load(given, closest)
    if diagnosis.bottleneck in (Bottleneck.CAPACITY, Bottleneck.PREFILL) and replicas > _max_replicas(given):
        found.append(f"about {replicas} replicas (maxReplicas is {_max_replicas(given)})")
    target = _tpot_target(given.slo)
    if target is not None and diagnosis.floors.tpot_ms > target:
        factor = diagnosis.floors.tpot_ms / target
        faster = [a.name for a in ACCELERATORS.values() if a.memory_bandwidth_bytes_per_s >=
                  factor * given.deployment.accelerator.memory_bandwidth_bytes_per_s]
        found.append(f"an accelerator with {factor:.1f}x the memory bandwidth ({', '.join(faster) or 'none known'}) "
                     f"or tensor parallelism {math.ceil(factor)}")
        found.append(f"a model at most {_params(given.deployment.model.num_params / factor)} parameters")
        if not given.tuning.allow_quality_change:
            found.append("allowQualityChange: true, so 8-bit weights can halve the bytes per token")
    if not found:
        found.append("a faster accelerator, more replicas or a smaller model")
    return found


def _params(count: float) -> str:
    """A parameter count as people write it: 7.0B, 350M, 12K."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return f"{count:.0f}"
