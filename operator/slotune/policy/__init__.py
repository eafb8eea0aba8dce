"""Policy: from a diagnosis to the one change to try next, or to Infeasible with what would be needed.

Each bottleneck has an ordered list of remedies (docs/architecture.md, "The tuning workflow", step 2); the first
one the spec allows, within the knob bounds, that was never tried before (kept, rolled back or crashed:
`excluded_keys`), is proposed with the metric it targets and the effect the roofline expects. Never revisiting a
config is the hysteresis that stops flapping.
Steps are sized with the capacity model (replicas a load needs, batch headroom) so few changes reach the SLO.
Quantization is proposed only when the spec allows quality changes, and before speculation on low-bandwidth
accelerators; speculation only where the roofline predicts that verifying drafted tokens costs little (decode bound
by weight reads) and never when its predicted throughput cost breaks the throughput floor.
When nothing is left, or the roofline puts a target below what any allowed knob can reach, the answer is Infeasible
with the closest configuration and what would be needed. Once every target holds, `propose_trim` offers cost savings
(fewer or cheaper replicas) and `propose_headroom` the fix a near-miss trim's window calls for.

Start here: every rule that chooses or rejects a change lives in this package, and the loop (slotune.loop) only
applies what it answers. Where each rule is:
- `diagnosis`: what limits the window (the bottleneck, the floors, the evidence), the input to every rule below;
- this module: `propose` (the next change, or Infeasible), `squeeze_verdict` (the roomiest config measured),
  `infeasible_evidence`, `propose_trim` (cost savings once the SLO holds);
- `remedies` (the ordered remedies per bottleneck), `moves` (single-knob steps), `sizing` (load, targets,
  admissibility, naming), `inputs` (what the policy reads and answers), `infeasible` (what would be needed),
  `best_effort` (the targets still in reach, the capacity steps when far overloaded);
- `headroom` (after a failed trim), `keep` (keep or roll back: the judge's verdict amended by `worst_miss` and the
  quality gate, one more window for an inconclusive one), `futile` (a lucky keep re-judged; moves that did not move
  the windows that miss), `worst_miss.badness` (how far a window is from the SLO: the closest config so far).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from slotune.api.tuning import Knob
from slotune.policy.best_effort import (
    capacity_steps,
    far_overload,
    overload_needs,
    roomiest,
    squeezed,
    without_targets,
)
from slotune.policy.diagnosis import Diagnosis, diagnose
from slotune.policy.headroom import propose_headroom
from slotune.policy.infeasible import infeasible
from slotune.policy.inputs import Infeasible, PolicyInput, Proposal, Remedy, kv_room
from slotune.policy.moves import budget_cap, chunked_prefill, enable_prefix_cache, quantize, speculate
from slotune.policy.remedies import percentile_of, remedies_for
from slotune.policy.sizing import (
    MAX_MOVE_ATTEMPTS,
    admissible,
    costs_nothing,
    describe_change,
    max_replicas,
    move_key,
    replicas_for_load,
)
from slotune.snapshot import LatencyMetric

log = logging.getLogger(__name__)

__all__ = ["MAX_MOVE_ATTEMPTS", "Infeasible", "PolicyInput", "Proposal", "costs_nothing", "describe_change",
           "infeasible_evidence",
           "move_key", "propose", "propose_headroom", "propose_trim", "squeeze_verdict", "weigh_knobs"]


def propose(diagnosis: Diagnosis, given: PolicyInput) -> Proposal | Infeasible:
    """The next change, or Infeasible (with a best-effort change for the targets still in reach, if any)."""
    if diagnosis.primary is None:
        raise ValueError("nothing to propose: the window meets every SLO target")
    diagnosis = weigh_knobs(diagnosis, given)
    overload = far_overload(diagnosis, given)
    if overload is not None:
        found = infeasible(diagnosis, given)
        reason = (f"the measured load needs about {overload} replicas even at {roomiest(given).describe()}; "
                  f"maxReplicas is {max_replicas(given)}")
        needs = (f"about {overload} replicas (maxReplicas is {max_replicas(given)})",
                 *(n for n in found.needs if "replicas (maxReplicas" not in n))
        return replace(found, reason=reason, needs=needs,
                       best_effort=_first(capacity_steps(given), diagnosis, given))
    squeeze = squeeze_verdict(diagnosis, given)
    if squeeze is not None:
        return squeeze
    proposal = _first(_remedies(diagnosis, given), diagnosis, given)
    if proposal is not None:
        return proposal
    return replace(infeasible(diagnosis, given), best_effort=_best_effort(diagnosis, given))


def infeasible_evidence(diagnosis: Diagnosis, given: PolicyInput) -> str | None:
    """What in this window alone says no allowed config can meet the SLO: a target below every allowed config's
    floor, a load the capacity model puts far beyond maxReplicas (before the verifying window at every allowed
    replica that `propose` waits for), or both latencies missed well at the roomiest config (`squeezed`). None when
    the window says no such thing. How soon a caller declares Infeasible after such a window is the measure of an
    early verdict."""
    if diagnosis.primary is None:
        return None
    diagnosis = weigh_knobs(diagnosis, given)
    if diagnosis.out_of_reach:
        return f"{', '.join(diagnosis.out_of_reach)} below every allowed config's floor"
    needed = overload_needs(diagnosis, given)
    if needed is not None:
        return f"the load needs about {needed} replicas (maxReplicas {max_replicas(given)})"
    return squeezed(diagnosis, given)


def squeeze_verdict(diagnosis: Diagnosis, given: PolicyInput) -> Infeasible | Proposal | None:
    """From a window measured at the roomiest config (`squeezed`), whether or not that config is kept (a change to
    it that is rolled back, as it broke the target the baseline met, still measured what the most capacity allowed
    does): Infeasible; or, where only chunked prefill or drafted tokens are left, that config with the first of them
    (chunked prefill, which may help both latencies, then speculation, which may shorten decode steps without
    slowing prefill): the one change left to measure before the verdict. A window squeezed but for them is close to
    the roomiest config, and the window measured there is the evidence; searching the trades first took 3-8 more
    changes in the tuner benchmark's code scenarios, which never turned chunked prefill on. None when the window
    says neither."""
    if diagnosis.primary is None:
        return None
    diagnosis = weigh_knobs(diagnosis, given)
    squeeze = squeezed(diagnosis, given)
    if squeeze is not None:
        return replace(infeasible(diagnosis, given), reason=squeeze)
    if squeezed(diagnosis, given, drafts_tried=False, chunked_tried=False) is None:
        return None
    chunked = chunked_prefill(given, "")
    if chunked is not None and chunked.knob in given.tuning.knobs and admissible(chunked.config, chunked.knob, given):
        return Proposal(chunked.config, chunked.knob, describe_change(given.config, chunked.config, chunked.knob),
                        "both latencies miss at every allowed replica with batches unbound; prefill chunks are the "
                        "one knob left that may shorten the steps that stall decodes (then only trades are left)",
                        LatencyMetric.TPOT, percentile_of(given.slo, LatencyMetric.TPOT, 99))
    if squeezed(diagnosis, given, drafts_tried=False) is None:
        return None
    drafts = speculate(given, given.snapshot.num_running_mean or 1.0)
    if drafts is None or not admissible(drafts.config, drafts.knob, given):
        return None
    return Proposal(drafts.config, drafts.knob, describe_change(given.config, drafts.config, drafts.knob),
                    f"both latencies miss at the roomiest config; drafted tokens are the one knob left that may "
                    f"shorten decode steps without slowing prefill: {drafts.why}", LatencyMetric.TPOT,
                    percentile_of(given.slo, LatencyMetric.TPOT, 99))


def _remedies(diagnosis: Diagnosis, given: PolicyInput) -> list[Remedy]:
    try:
        return remedies_for(diagnosis, given)
    except ValueError:  # a remedy the knob schema refuses is a policy bug: it must never stop the loop
        log.exception("policy: building remedies failed")
        return []


def _first(remedies: list[Remedy], diagnosis: Diagnosis, given: PolicyInput) -> Proposal | None:
    primary = diagnosis.primary
    assert primary is not None
    for remedy in remedies:
        if admissible(remedy.config, remedy.knob, given, revisit=remedy.revisit):
            metric = remedy.target or primary.target.metric
            percentile = percentile_of(given.slo, metric, primary.target.percentile) if remedy.target else (
                primary.target.percentile)
            return Proposal(remedy.config, remedy.knob, describe_change(given.config, remedy.config, remedy.knob),
                            remedy.why, metric, percentile)
    return None


def _best_effort(diagnosis: Diagnosis, given: PolicyInput) -> Proposal | None:
    """With the out-of-reach targets set aside, what the others still call for."""
    if not diagnosis.out_of_reach:
        return None
    reachable = without_targets(given.slo, diagnosis.out_of_reach)
    if reachable is None:
        return None
    rest = replace(given, slo=reachable)
    again = diagnose(given.snapshot, given.config, reachable, given.deployment, given.workload, given.tuning,
                     given.spec_acceptance, given.draft_model)
    if again.primary is None or again.out_of_reach:
        return None
    proposal = _first(_remedies(again, rest), again, rest)
    return None if proposal is None else replace(proposal, reason=f"best effort: {proposal.reason}")


def weigh_knobs(diagnosis: Diagnosis, given: PolicyInput) -> Diagnosis:
    """The diagnosis with floors over every config the spec allows (precision, speculation at the measured
    acceptance), when the caller diagnosed without them; its extra evidence lines are kept."""
    if diagnosis.weighed_knobs or diagnosis.primary is None:
        return diagnosis
    args = (given.snapshot, given.config, given.slo, given.deployment, given.workload)
    weighed = diagnose(*args, given.tuning, given.spec_acceptance, given.draft_model)
    plain = diagnose(*args, None, given.spec_acceptance)
    extra = diagnosis.evidence[len(plain.evidence):]  # what the caller added (the measured speed)
    return replace(weighed, evidence=(*weighed.evidence, *extra))


def propose_trim(given: PolicyInput) -> Proposal | None:
    """Once every SLO holds: make replicas cheaper (prefix caching, 8-bit weights where allowed), then use fewer of
    them, down to what the capacity model says the load needs. Each step is kept only if the SLO still holds."""
    c, bounds = given.config, given.tuning.bounds
    efficiency = _efficiency(given) if c.replicas > bounds.min_replicas else []
    needed = max(bounds.min_replicas, replicas_for_load(given, c))
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
    for config, knob, why, *_ in candidates:
        if admissible(config, knob, given):
            return Proposal(config, knob, describe_change(c, config, knob), why, target.metric, target.percentile,
                            trim=True)
    return None


def _efficiency(given: PolicyInput) -> list[Remedy]:
    """Changes that let each replica carry more, so that fewer replicas can follow; gentle steps (x2), since each
    is kept only if the SLO still holds."""
    c, s, bounds = given.config, given.snapshot, given.tuning.bounds
    found = [r for r in (enable_prefix_cache(given),) if r]
    # With one replica fewer, each remaining replica runs r / (r - 1) times the batch: raise the limit if it would bind.
    scale = c.replicas / max(c.replicas - 1, 1)
    binds = (s.num_running_mean or 0.0) * scale >= 0.5 * c.max_num_seqs
    if binds and kv_room(s) and 2 * c.max_num_seqs <= bounds.max_num_seqs.max:
        found.append(Remedy(c.with_changes(max_num_seqs=2 * c.max_num_seqs), Knob.MAX_NUM_SEQS,
                            "room for larger batches per replica"))
    budget = min(2 * c.max_num_batched_tokens, bounds.max_num_batched_tokens.max, budget_cap(given))
    if budget > c.max_num_batched_tokens:
        found.append(Remedy(c.with_changes(max_num_batched_tokens=budget), Knob.MAX_NUM_BATCHED_TOKENS,
                            "fewer, larger prefill steps"))
    quant = quantize(given, "8-bit weights serve more per replica")
    return found + [r for r in (quant,) if r]
