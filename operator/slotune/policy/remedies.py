"""Remedies per bottleneck (DESIGN.md workflow step 2), most promising first, then plain fallbacks the capacity model
does not predict to be enough, tried and verified before giving up."""

from __future__ import annotations

from slotune.api.tuning import Knob
from slotune.perfmodel import capacity
from slotune.perfmodel.floors import decode_token_s
from slotune.policy.diagnosis import Bottleneck, Diagnosis
from slotune.policy.inputs import PolicyInput, Remedy, kv_room
from slotune.policy.moves import (
    budget_cap,
    budget_up,
    chunked_prefill,
    enable_prefix_cache,
    quantize,
    replicas_remedy,
    speculate,
    unspeculate,
)
from slotune.policy.sizing import (
    acceptance_of,
    batch_binds,
    batch_failed,
    load_of,
    max_replicas,
    pow2_at_most,
    replicas_for_load,
    tpot_target,
)
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric

LOW_BANDWIDTH_BYTES_PER_S = 1e12  # below this, weights dominate decode: quantize before speculating


def percentile_of(slo: SLOSpec, metric: LatencyMetric, fallback: int) -> int:
    return max((t.percentile for t in slo.targets() if t.metric is metric), default=fallback)


def remedies_for(diagnosis: Diagnosis, given: PolicyInput) -> list[Remedy]:
    """Every remedy worth a window, most promising first: speculation off where measured acceptance makes it a
    loss; then, where a TPOT target is below this config's floor but not the reachable one, the precision and
    speculation changes that lower the floor, before the bottleneck's own list; the floor movers are considered under
    every bottleneck where a TPOT target is violated. Nothing where a target is below every allowed config's floor."""
    unspeculated = unspeculate(given)
    head = [unspeculated] if unspeculated else []
    if diagnosis.out_of_reach:  # below every allowed config's floor: no knob can meet it
        return head
    by_bottleneck = {
        Bottleneck.CAPACITY: _capacity, Bottleneck.PREFIX_CACHE: _prefix_cache, Bottleneck.PREFILL: _prefill,
        Bottleneck.PREFILL_INTERFERENCE: _interference, Bottleneck.DECODE_BANDWIDTH: _decode,
    }
    remedies = by_bottleneck[diagnosis.bottleneck](given)
    movers = _floor_movers(diagnosis, given)
    remedies = [*movers, *remedies] if diagnosis.below_floor else [*remedies, *movers]
    last = _queued_behind_decodes(diagnosis, given)
    return _unique([*head, *remedies, *_fallbacks(diagnosis.bottleneck, given), *last])


def _queued_behind_decodes(diagnosis: Diagnosis, given: PolicyInput) -> list[Remedy]:
    """Speculation for a first-token miss that is queueing behind slow decodes: the queue dominates TTFT and the
    requests that hold the batch's slots spend longer decoding than prefilling, so a slot frees only as fast as a
    decode finishes. Drafted tokens shorten every decode, hence the wait. Last, after every plain remedy: without it
    a TTFT-only miss (x1.11 in a real SmolLM2 run) was called Infeasible with speculation never measured."""
    s = given.snapshot
    ttft_missed = any(r.target.metric is LatencyMetric.TTFT for r in diagnosis.violated)
    if diagnosis.bottleneck is not Bottleneck.CAPACITY or not ttft_missed:
        return []
    decode, prefill = s.decode.p50_ms, s.prefill.p50_ms
    if decode is None or decode <= (prefill or 0.0):
        return []
    drafts = speculate(given, s.num_running_mean or 1.0)
    if drafts is None:
        return []
    return [Remedy(drafts.config, drafts.knob, f"queueing behind decodes ({decode:.0f} ms each, prefill "
                   f"{prefill or 0.0:.0f} ms): shorter decodes free batch slots sooner; {drafts.why}",
                   LatencyMetric.TTFT)]


def _floor_movers(diagnosis: Diagnosis, given: PolicyInput) -> list[Remedy]:
    """Speculation and 8-bit weights, the knobs that lower the TPOT floor, wherever a TPOT target is violated:
    whatever the window's bottleneck, a slower step than the target allows is theirs to fix too."""
    if not any(r.target.metric is LatencyMetric.TPOT for r in diagnosis.violated):
        return []
    batch = given.snapshot.num_running_mean or 1.0
    found = [r for r in (speculate(given, batch),
                         quantize(given, "decode is bound by weight bytes per token: 8-bit weights halve them")) if r]
    context = given.snapshot.mean_decode_context_tokens
    acceptance, target = acceptance_of(given), tpot_target(given.slo) or 0.0
    guessed = given.spec_acceptance is None and given.snapshot.spec_acceptance_rate is None

    def rank(remedy: Remedy) -> tuple[bool, bool, float]:
        # One that meets the target alone first; among those, one whose floor rests on no guess (speculation at
        # the prior acceptance is one), then the lower floor.
        floor_ms = decode_token_s(given.deployment, remedy.config, 1, context, acceptance) * 1000.0
        return floor_ms > target, guessed and remedy.knob is Knob.SPECULATIVE, floor_ms

    return sorted(found, key=rank)


def _unique(remedies: list[Remedy]) -> list[Remedy]:
    seen: set[str] = set()
    found = []
    for remedy in remedies:
        if remedy.config.key() + str(remedy.config.replicas) not in seen:
            seen.add(remedy.config.key() + str(remedy.config.replicas))
            found.append(remedy)
    return found


def _fallbacks(bottleneck: Bottleneck, given: PolicyInput) -> list[Remedy]:
    """Plain steps the capacity model does not predict to be enough, tried (and verified) before giving up: the
    model is approximate, and a wrong Infeasible costs more than a rolled-back change."""
    c, bounds, s = given.config, given.tuning.bounds, given.snapshot
    first_token = bottleneck in (Bottleneck.CAPACITY, Bottleneck.PREFILL, Bottleneck.PREFIX_CACHE)
    found: list[Remedy] = []
    roomy = 2 * c.max_num_seqs <= bounds.max_num_seqs.max and kv_room(s)
    if first_token and roomy and batch_binds(given):
        found.append(Remedy(c.with_changes(max_num_seqs=2 * c.max_num_seqs), Knob.MAX_NUM_SEQS, "more batch headroom"))
    if first_token and 2 * c.max_num_batched_tokens <= min(bounds.max_num_batched_tokens.max, 8192):
        found.append(Remedy(c.with_changes(max_num_batched_tokens=2 * c.max_num_batched_tokens),
                      Knob.MAX_NUM_BATCHED_TOKENS, "more prompt tokens per step"))
    target, tpot = tpot_target(given.slo), s.tpot.p99_ms or 0.0
    # TPOT is tight when it is near its target, or when a larger batch was rolled back before (it broke TPOT).
    tight = target is not None and (tpot >= 0.8 * target or batch_failed(given))
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
    quant = quantize(given, "8-bit weights: less to read per step, faster tensor cores")
    replicas = replicas_remedy(given, "more replicas share the load")
    return found + [r for r in (quant, replicas) if r]


def _capacity(given: PolicyInput) -> list[Remedy]:
    c, s = given.config, given.snapshot
    running, waiting = s.num_running_mean or 0.0, s.num_waiting_mean or 0.0
    remedies: list[Remedy] = []
    batch_fits = kv_room(s) and s.num_preemptions == 0
    limit = min(capacity.batch_limit(given.deployment, c, load_of(given), tpot_target(given.slo)),
                given.tuning.bounds.max_num_seqs.max)
    if batch_fits and batch_binds(given) and 1.5 * c.max_num_seqs <= limit:
        seqs = max(min(2 * c.max_num_seqs, limit), pow2_at_most(limit))
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
    replicas = replicas_remedy(given, "queueing: the load needs more replicas")
    sized = None
    if replicas and _needs_more_replicas(given):
        sized = _sized_capacity(given, remedies[0]) if remedies else None
        remedies.insert(0, replicas)
    quant = quantize(given, "low-bandwidth accelerator: 8-bit weights nearly double what each replica decodes")
    if quant and given.deployment.accelerator.memory_bandwidth_bytes_per_s < LOW_BANDWIDTH_BYTES_PER_S:
        remedies.insert(0, quant)
    budget = budget_up(given, "a small token budget slows admission")
    remedies += [r for r in (budget, replicas) if r]
    chunked = chunked_prefill(given, "a larger batch broke TPOT: without chunked prefill every admitted prompt "
                               "stalls all running decodes for its whole prefill", LatencyMetric.TPOT)
    if chunked and batch_failed(given):
        remedies.insert(0, chunked)
    prefix = enable_prefix_cache(given)  # costs nothing and cuts every request's prefill work: first
    first = [r for r in (sized, prefix) if r]  # the sized change turns it on too
    return [*first, *remedies]


def _sized_capacity(given: PolicyInput, batch: Remedy) -> Remedy | None:
    """Where the load needs more replicas and the batch limit binds too, one capacity change sized by the model: the
    batch step and the replicas the load needs at that batch (with prefix caching where prompts share prefixes,
    which costs nothing and changes no output). Both answer the one bottleneck, queueing, and are judged on it as
    one change; one knob at a time would first add the replicas the small batch needs (every allowed one,
    typically), then raise the batch, then trim the replicas back. 8-bit weights never ride along: they alter
    outputs, so they are a change of their own, attributed and passed through the quality gate alone. If the sized
    change is rolled back, the single-knob steps behind it are still there."""
    c, knobs = given.config, given.tuning.knobs
    if batch.knob is not Knob.MAX_NUM_SEQS or Knob.REPLICAS not in knobs or Knob.MAX_NUM_SEQS not in knobs:
        return None
    target = batch.config
    prefix = enable_prefix_cache(given)
    if prefix is not None and Knob.ENABLE_PREFIX_CACHING in knobs:
        target = target.with_changes(enable_prefix_caching=True)
    wanted = min(max(c.replicas + 1, replicas_for_load(given, target)), max_replicas(given))
    if wanted <= c.replicas:
        return None
    return Remedy(target.with_changes(replicas=wanted), Knob.REPLICAS,
                  f"queueing: {batch.why}; the load needs {wanted} replicas at that batch")


def _needs_more_replicas(given: PolicyInput) -> bool:
    """Even with the most batch the bounds allow (and prefix caching where prompts share prefixes), the current
    replicas would be over-utilised."""
    roomy = given.config.with_changes(max_num_seqs=given.tuning.bounds.max_num_seqs.max)
    if enable_prefix_cache(given) is not None:
        roomy = roomy.with_changes(enable_prefix_caching=True)
    quant = quantize(given, "")
    if quant is not None:
        roomy = roomy.with_changes(quantization=quant.config.quantization)
    return replicas_for_load(given, roomy) > given.config.replicas


def _prefix_cache(given: PolicyInput) -> list[Remedy]:
    c = given.config
    if not c.enable_prefix_caching:
        return [Remedy(c.with_changes(enable_prefix_caching=True), Knob.ENABLE_PREFIX_CACHING,
                 "shared prompt prefixes are recomputed on every request"), *_prefill(given)]
    return _prefill(given)


def _prefill(given: PolicyInput) -> list[Remedy]:
    remedies = [r for r in (enable_prefix_cache(given), budget_up(given, "prompts need many steps to prefill"),
                            quantize(given, "prefill is compute bound: 8-bit weights run on faster tensor cores"),
                            replicas_remedy(given, "prefill work spread over more replicas")) if r]
    return remedies


def _interference(given: PolicyInput) -> list[Remedy]:
    c, bounds = given.config, given.tuning.bounds
    chunked = chunked_prefill(given, "whole-prompt prefill steps stall every running decode")
    remedies: list[Remedy] = [chunked] if chunked else []
    safe = budget_cap(given)
    smaller = max(min(c.max_num_batched_tokens // 2, safe), bounds.max_num_batched_tokens.min, 256)
    if smaller < c.max_num_batched_tokens:
        remedies.append(Remedy(c.with_changes(max_num_batched_tokens=smaller), Knob.MAX_NUM_BATCHED_TOKENS,
                         "smaller prefill chunks per step bound the stall each decode sees"))
    replicas = replicas_remedy(given, "fewer prompts per replica interleave with decodes")
    return [*remedies, *([replicas] if replicas else [])]


def _decode(given: PolicyInput) -> list[Remedy]:
    s, accel = given.snapshot, given.deployment.accelerator
    batch = s.num_running_mean or 1.0
    step = given.deployment.step_model(given.config)
    context = s.mean_decode_context_tokens
    batch_bound = batch > 4 and step.decode_step_s(round(batch), context) > 1.5 * step.decode_step_s(1, context)
    quant = quantize(given, "decode is bound by weight bytes per token: 8-bit weights halve them")
    spec = speculate(given, batch)
    replicas = replicas_remedy(given, f"{batch:.0f} sequences per step slow each token: spread them")
    ordered = [quant, spec] if accel.memory_bandwidth_bytes_per_s < LOW_BANDWIDTH_BYTES_PER_S else [spec, quant]
    if batch_bound:
        ordered.insert(0, replicas)
    else:
        ordered.append(replicas)
    return [r for r in ordered if r]
