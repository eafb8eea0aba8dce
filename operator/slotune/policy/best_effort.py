"""When a target is out of reach: how to tell early, and what is still worth improving.

Three kinds of evidence end the search early: a target below every allowed config's floor (`Diagnosis.out_of_reach`);
a load far beyond what the allowed replicas can carry even at the roomiest allowed config (the capacity model on
the window's measured load; FAR_BEYOND leaves room for the model's error, so a load it puts within reach is still
tried); and a squeeze measured at the roomiest config (`squeezed`): every allowed replica, batches unbound, every
knob that helps both latencies at once set, and still the first token and the next token both miss well.
Infeasible is declared then, and the other targets are still worth meeting: best effort is the policy's proposal
against the SLO without the unreachable targets, or, for an overload, the step toward the most capacity the bounds
allow (replicas, then batch), so the config reported as closest is close where it can be.
"""

from __future__ import annotations

import math
from dataclasses import replace

from slotune.api.tuning import Knob
from slotune.knobs import RuntimeConfig
from slotune.perfmodel import capacity
from slotune.policy.diagnosis import Bottleneck, Diagnosis
from slotune.policy.inputs import PolicyInput, Remedy
from slotune.policy.moves import chunked_prefill, enable_prefix_cache, quantize, speculate, speculation_estimate
from slotune.policy.sizing import batch_binds, load_of, max_replicas, tpot_target
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric

FAR_BEYOND = 2.0  # needed / allowed replicas beyond the capacity model's error (it read 6 for 3 on one scenario)
# Both the first-token and the per-token target missed at the roomiest config, by SQUEEZED squared in product (each
# miss's ratio multiplied): a trade between them would have to win that back, beyond a window's noise at the edge.
# In the tuner benchmark's feasible scenarios no window at the roomiest config missed both at all; the infeasible
# ones that squeeze read x4.0-x10 (x5.0 with drafts on: TTFT x4.9, TPOT x1.02, where drafts fixed TPOT alone).
SQUEEZED = 1.5


def roomiest(given: PolicyInput) -> RuntimeConfig:
    """The current config with the most per-replica capacity the bounds allow, at the most replicas."""
    c, bounds = given.config, given.tuning.bounds
    roomy = c.with_changes(max_num_seqs=bounds.max_num_seqs.max, replicas=max_replicas(given))
    for remedy in (enable_prefix_cache(given), quantize(given, "")):
        if remedy is not None:
            moved = c.changed_knobs(remedy.config)
            roomy = roomy.with_changes(**{name: getattr(remedy.config, name) for name in moved})
    return roomy


def far_overload(diagnosis: Diagnosis, given: PolicyInput) -> int | None:
    """Replicas the measured load needs at the roomiest allowed config, when that is far beyond maxReplicas, the
    window queues (capacity is the bottleneck) and it runs every allowed replica (the verifying window); None
    otherwise. A declared request rate must agree: one bursty window's arrivals-over-their-span reads many times
    the mean rate, and a burst is not an overload."""
    if given.config.replicas < max_replicas(given):
        return None
    return overload_needs(diagnosis, given)


def overload_needs(diagnosis: Diagnosis, given: PolicyInput) -> int | None:
    """The capacity model's verdict on the window alone, before any verifying window at every allowed replica:
    replicas the measured load needs at the roomiest allowed config when that is far beyond maxReplicas."""
    if diagnosis.bottleneck is not Bottleneck.CAPACITY:
        return None
    load, most, target = load_of(given), max_replicas(given), tpot_target(given.slo)
    needed = capacity.replicas_needed(given.deployment, roomiest(given), load, target)
    declared = given.workload.request_rate_per_s if given.workload is not None else None
    if declared is not None and declared < load.request_rate_per_s:
        calm = replace(load, request_rate_per_s=declared)
        needed = min(needed, capacity.replicas_needed(given.deployment, roomiest(given), calm, target))
    return needed if needed > FAR_BEYOND * most else None


def squeezed(diagnosis: Diagnosis, given: PolicyInput, drafts_tried: bool = True,
             chunked_tried: bool = True) -> str | None:
    """A window measured at the roomiest config that misses the first-token and the per-token target both, by
    SQUEEZED squared in product: every allowed replica, a batch limit that does not bind (the window ran under half
    of it), every knob that helps both at once already set (prefix caching where prompts share prefixes, 8-bit
    weights where allowed, chunked prefill), and speculation on, or predicted by its measured acceptance to fall
    short (`speculation_could_help`). What is left trades one target for the other: a smaller batch limit or token
    budget shortens each step and queues prompts longer, a larger budget prefills faster and lengthens every decode
    step. The capacity model cannot say this: it read 5-7 replicas for loads that 2-4 carry, on feasible scenarios
    as on these. None otherwise. `drafts_tried=False`: the squeeze but for speculation, which is then the one
    change left to measure; `chunked_tried=False`: but for chunked prefill as well (whole-prompt prefill steps
    still stall decodes), the change that brings the window to the roomiest config."""
    c, s = given.config, given.snapshot
    if c.replicas < max_replicas(given) or batch_binds(given):
        return None
    chunks = chunked_prefill(given, "") if chunked_tried else None
    helps_both = (enable_prefix_cache(given), quantize(given, ""), chunks)
    if any(r is not None and r.knob in given.tuning.knobs for r in helps_both):
        return None
    worst = _worst_ratios(diagnosis, given)
    ttft, tpot = worst[LatencyMetric.TTFT], worst[LatencyMetric.TPOT]
    if max(ttft, tpot) <= 1.0 or min(ttft, tpot) <= 0.0 or ttft * tpot < SQUEEZED ** 2:
        return None
    if drafts_tried and speculation_could_help(given, tpot if tpot > 1.0 else ttft * tpot):
        return None
    if min(ttft, tpot) > 1.0:
        misses = f"TTFT misses x{ttft:.1f} and TPOT x{tpot:.1f}"
    else:
        # One latency met: only where the capacity model, too, puts the load beyond every allowed replica (within
        # its error, FAR_BEYOND) is the miss the load's and not a slow window's (a busy machine's TTFT alone).
        needed = capacity.replicas_needed(given.deployment, roomiest(given), load_of(given), tpot_target(given.slo))
        if needed <= max_replicas(given):
            return None
        missed, met = ("TTFT", "TPOT") if ttft > 1.0 else ("TPOT", "TTFT")
        misses = (f"{missed} misses x{max(ttft, tpot):.1f} while {met} already uses {min(ttft, tpot):.2f} of its "
                  f"target (x{ttft * tpot:.1f} to win back by a trade; the load needs about {needed} replicas)")
    return (f"at every allowed replica ({c.replicas}) with batches unbound ({s.num_running_mean or 0.0:.1f} of "
            f"{c.max_num_seqs} running), {misses}: the knobs left trade one for the other")


def _worst_ratios(diagnosis: Diagnosis, given: PolicyInput) -> dict[LatencyMetric, float]:
    """Observed / target of each latency's worst percentile target, met ones included (0 where none is set): a
    trade that shortens one latency lengthens the other, so the one met must have room for the other's miss."""
    results = [*diagnosis.violated, *(r for r in given.slo.evaluate(given.snapshot) if r.met)]
    return {metric: max((r.ratio for r in results if r.target.metric is metric and math.isfinite(r.ratio)),
                        default=0.0)
            for metric in (LatencyMetric.TTFT, LatencyMetric.TPOT)}


def speculation_could_help(given: PolicyInput, tpot_miss: float) -> bool:
    """Whether drafted tokens might still bring TPOT under its target (the room a larger token budget would need to
    bring TTFT under its own): speculation is allowed, off, and either its acceptance on this workload was never
    measured (a prior predicts nothing here) or the measured acceptance predicts a speedup within SQUEEZED of the
    miss. Speculation already on was measured in this very window."""
    c, batch = given.config, given.snapshot.num_running_mean or 1.0
    if c.speculative is not None or Knob.SPECULATIVE not in given.tuning.knobs:
        return False
    drafts = speculate(given, batch)
    if drafts is None:
        return False  # the roofline expects no gain at this batch, even at the prior
    if drafts.config.key() in given.excluded_keys:
        return False  # measured at this very config already (and rolled back)
    if given.spec_acceptance is None:
        return True
    return speculation_estimate(given, drafts.config, batch).speedup * SQUEEZED >= tpot_miss


def capacity_steps(given: PolicyInput) -> list[Remedy]:
    """Toward the most capacity the bounds allow: every replica, then the largest batch, one knob at a time."""
    c, bounds = given.config, given.tuning.bounds
    steps = [Remedy(c.with_changes(replicas=max_replicas(given)), Knob.REPLICAS,
                    "best effort: the load is beyond every allowed replica count; serve as much of it as they can")]
    limit = min(capacity.batch_limit(given.deployment, c, load_of(given), tpot_target(given.slo)),
                bounds.max_num_seqs.max)
    if limit > c.max_num_seqs:
        steps.append(Remedy(c.with_changes(max_num_seqs=limit), Knob.MAX_NUM_SEQS,
                            f"best effort: batches of up to {limit}, what the KV cache and the TPOT target allow"))
    return [*steps, *(r for r in (enable_prefix_cache(given), quantize(given, "best effort: 8-bit weights")) if r)]


def without_targets(slo: SLOSpec, names: tuple[str, ...]) -> SLOSpec | None:
    """The SLO without the named targets (e.g. tpot_p99); None when none would be left."""
    updates: dict[str, object] = {}
    for target in slo.targets():
        if target.name in names:
            current = updates.get(target.metric.value, getattr(slo, target.metric.value))
            updates[target.metric.value] = current.model_copy(update={f"p{target.percentile}": None})  # type: ignore[union-attr]
    for metric, targets in list(updates.items()):
        if all(targets.at(p) is None for p in (50, 95, 99)):  # type: ignore[attr-defined]
            updates[metric] = None
    reduced = slo.model_copy(update=updates)
    return reduced if reduced.targets() else None
