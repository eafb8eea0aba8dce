"""Diagnosis: from one window's breakdown to the dominant bottleneck, with the numbers behind it.

The rules are DESIGN.md's workflow step 2, applied to the SLO targets the window violates:
- queue time dominates TTFT -> capacity;
- prefill dominates TTFT -> prefix caching off or ineffective (hit rate well below the shared-prefix share), else
  prefill (token budget, or the hardware);
- TPOT tail high while its median is within the TPOT target -> prefill interference;
- TPOT median above the target -> decode speed (bandwidth, speculation, precision) or capacity, whatever the tail: a
  median already over the target is not a tail problem.
The roofline of the declared accelerator gives each config's floor (`slotune.perfmodel.floors`: precision and
speculation at the workload's draft acceptance included) and the least floor any allowed config has, so the
diagnosis tells a badly configured deployment (below this config's floor, above the reachable one) from one whose
targets are physically out of reach (below every allowed config's floor).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from slotune.api.status import DiagnosisReport
from slotune.api.tuning import TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.perfmodel.floors import PRIOR_ACCEPTANCE, Floors, floor_variants, floors, per_token_acceptance
from slotune.slo import SLOSpec, TargetResult
from slotune.snapshot import LatencyMetric, MetricsSnapshot
from slotune.workload import WorkloadSpec

QUEUE_DOMINATES = 0.5  # queue share of TTFT at the violated percentile
TAIL_RATIO = 1.6  # TPOT p99 / p50 above this, with the median within the target, is a tail problem
ITL_TAIL_RATIO = 4.0  # per-token gaps: a p99 this far above the median means decodes stall behind long steps
PREFIX_EFFECTIVE = 0.6  # hit rate below this share of the shared-prefix token share is 'ineffective'
FULL_CONFIDENCE_SAMPLES = 200


class Bottleneck(StrEnum):
    CAPACITY = "capacity"
    PREFILL = "prefill"
    PREFIX_CACHE = "prefix-cache"
    DECODE_BANDWIDTH = "decode-bandwidth"
    PREFILL_INTERFERENCE = "prefill-interference"
    NONE = "none"


@dataclass(frozen=True)
class Diagnosis:
    bottleneck: Bottleneck
    evidence: tuple[str, ...]
    confidence: float
    violated: tuple[TargetResult, ...]
    floors: Floors
    out_of_reach: tuple[str, ...]  # violated targets below every allowed config's floor: no tuning can meet them
    below_floor: tuple[str, ...] = ()  # violated targets below this config's floor only: precision or speculation
    acceptance: float = PRIOR_ACCEPTANCE  # per-token draft acceptance the floors assumed
    weighed_knobs: bool = False  # the reachable floors weighed the allowed knobs (diagnose was given `tuning`)

    @property
    def primary(self) -> TargetResult | None:
        """The worst violated target (largest observed / target)."""
        return max(self.violated, key=lambda r: r.ratio, default=None)

    def report(self, suggestion: str = "") -> DiagnosisReport:
        return DiagnosisReport(bottleneck=self.bottleneck.value, evidence=list(self.evidence)[:20],
                               suggestion=suggestion, confidence=round(self.confidence, 3))


def diagnose(snapshot: MetricsSnapshot, config: RuntimeConfig, slo: SLOSpec, deployment: Deployment,
             workload: WorkloadSpec | None = None, tuning: TuningSpec | None = None,
             acceptance: float | None = None, draft_model: str | None = None) -> Diagnosis:
    """The dominant bottleneck of the window against the SLO. `tuning` says which floor-moving knobs are allowed
    (None: only the current config counts); `acceptance` is the workload's measured per-token draft acceptance
    (None: this window's, when it speculates, else the prior)."""
    results = slo.evaluate(snapshot)
    violated = tuple(r for r in results if not r.met)
    accept = window_acceptance(snapshot, config, acceptance)
    found = _floors(snapshot, config, deployment, workload, accept, tuning, draft_model)
    out_of_reach = tuple(r.target.name for r in violated if r.target.target_ms < _floor_of(r, found, reachable=True))
    below = tuple(r.target.name for r in violated
                  if r.target.name not in out_of_reach and r.target.target_ms < _floor_of(r, found, reachable=False))
    confidence = min(1.0, snapshot.num_requests / FULL_CONFIDENCE_SAMPLES)
    if not violated:
        lines = tuple(f"{r.target.name} {_ms(r.observed_ms)} <= target {r.target.target_ms:g} ms" for r in results)
        return Diagnosis(Bottleneck.NONE, lines, confidence, (), found, (), (), accept, tuning is not None)
    # A target out of physical reach decides the case; otherwise first-token latency comes first, since queueing
    # and prefill fixes usually change TPOT too.
    unreachable = [r for r in violated if r.target.name in out_of_reach or r.target.name in below]
    latency_first = [r for r in violated if r.target.metric is not LatencyMetric.TPOT]
    worst = max(unreachable or latency_first or violated, key=lambda r: r.ratio)
    if worst.target.metric is LatencyMetric.TPOT:
        bottleneck, lines = _decode_rule(snapshot, config, slo, found)
    else:
        bottleneck, lines = _first_token_rule(snapshot, config, worst, found, workload)
    head = f"{worst.target.name} {_ms(worst.observed_ms)} > target {worst.target.target_ms:g} ms"
    lines = (head, *lines,
             *(f"{name} is below the roofline floor of every allowed config" for name in out_of_reach),
             *(f"{name} is below this config's floor ({found.tpot_ms:.1f} ms) but not the reachable one "
               f"({found.reachable_tpot_ms:.1f} ms, {found.best_config.describe()})" for name in below))
    return Diagnosis(bottleneck, lines, confidence, violated, found, out_of_reach, below, accept,
                     tuning is not None)


def window_acceptance(snapshot: MetricsSnapshot, config: RuntimeConfig, known: float | None) -> float:
    """Per-token draft acceptance: this window's when it speculated, else what was measured before on this
    workload, else the prior."""
    if config.speculative is not None and snapshot.spec_acceptance_rate is not None:
        return per_token_acceptance(snapshot.spec_acceptance_rate, config.speculative.num_speculative_tokens)
    return PRIOR_ACCEPTANCE if known is None else known


def _first_token_rule(snapshot: MetricsSnapshot, config: RuntimeConfig, worst: TargetResult, floors: Floors,
                      workload: WorkloadSpec | None) -> tuple[Bottleneck, tuple[str, ...]]:
    p = worst.target.percentile
    ttft, queue = snapshot.ttft.at(p) or 0.0, snapshot.queue.at(p) or 0.0
    share = queue / ttft if ttft > 0 else 0.0
    occupancy = snapshot.num_running_mean or 0.0
    queue_line = f"queue p{p} {queue:.0f} ms is {share:.0%} of TTFT p{p} {ttft:.0f} ms"
    if share >= QUEUE_DOMINATES:
        kv = snapshot.kv_cache_usage
        return Bottleneck.CAPACITY, (
            queue_line, f"running {occupancy:.1f} of max_num_seqs {config.max_num_seqs} on average, "
            f"{snapshot.num_waiting_mean or 0:.1f} waiting",
            f"KV cache usage {kv:.0%}" if kv is not None else "KV cache usage unknown",
            f"{snapshot.num_preemptions:.0f} preemptions")
    prefill = snapshot.prefill.at(p) or 0.0
    lines = (queue_line, f"prefill p{p} {prefill:.0f} ms against a roofline floor of {floors.ttft_ms:.0f} ms "
             f"for the mean prompt of {snapshot.mean_prompt_tokens or 0:.0f} tokens")
    shared = _shared_token_share(workload)
    hit = snapshot.prefix_cache_hit_rate or 0.0
    if shared > 0 and not config.enable_prefix_caching:
        return Bottleneck.PREFIX_CACHE, (*lines, f"prefix caching is off while ~{shared:.0%} of prompt tokens "
                                         "are shared prefixes")
    if shared > 0 and hit < PREFIX_EFFECTIVE * shared:
        return Bottleneck.PREFIX_CACHE, (*lines, f"prefix-cache hit rate {hit:.0%} is well below the shared "
                                         f"share ~{shared:.0%}")
    mean_prompt = snapshot.mean_prompt_tokens or 0.0
    return Bottleneck.PREFILL, (*lines, f"token budget {config.max_num_batched_tokens} per step vs mean prompt "
                                f"{mean_prompt:.0f} tokens")


def _decode_rule(snapshot: MetricsSnapshot, config: RuntimeConfig, slo: SLOSpec,
                 floors: Floors) -> tuple[Bottleneck, tuple[str, ...]]:
    p50, p99 = snapshot.tpot.p50_ms or 0.0, snapshot.tpot.p99_ms or 0.0
    itl50, itl99 = snapshot.itl.p50_ms, snapshot.itl.p99_ms
    # The median is fine only within the tightest TPOT target: a median already over it is decode speed or
    # capacity, however long the tail (shorter prefill chunks do not make the median step faster).
    tightest = min((t.target_ms for t in slo.targets() if t.metric is LatencyMetric.TPOT), default=p99 / TAIL_RATIO)
    median_fine = p50 <= tightest
    tail = p99 / p50 if p50 > 0 else 0.0
    lines = [f"TPOT p50 {p50:.1f} ms, p99 {p99:.1f} ms (tail x{tail:.2f})"]
    if itl50 and itl99:
        lines.append(f"inter-token p50 {itl50:.1f} ms, p99 {itl99:.1f} ms")
    itl_tail = itl99 / itl50 if itl50 and itl99 else 0.0
    if median_fine and (tail >= TAIL_RATIO or itl_tail >= ITL_TAIL_RATIO):
        lines.append(f"chunked prefill {'on' if config.enable_chunked_prefill else 'off'}, token budget "
                     f"{config.max_num_batched_tokens}: long prefill steps stall decodes")
        return Bottleneck.PREFILL_INTERFERENCE, tuple(lines)
    lines.append(f"roofline floor {floors.tpot_ms:.1f} ms per token at batch 1 (reachable "
                 f"{floors.reachable_tpot_ms:.1f} ms); running "
                 f"{snapshot.num_running_mean or 0:.1f} sequences on average")
    return Bottleneck.DECODE_BANDWIDTH, tuple(lines)


def _floors(snapshot: MetricsSnapshot, config: RuntimeConfig, deployment: Deployment, workload: WorkloadSpec | None,
            acceptance: float, tuning: TuningSpec | None, draft_model: str | None) -> Floors:
    prompt = round(snapshot.mean_prompt_tokens or (workload.prompt.p50 if workload else 1))
    context = prompt + (snapshot.mean_generation_tokens or 0.0) / 2
    variants = floor_variants(config, tuning, deployment, draft_model) if tuning is not None else []
    return floors(deployment, config, prompt, context, _shared_token_share(workload), acceptance, variants)


def _floor_of(result: TargetResult, found: Floors, reachable: bool) -> float:
    # Every request's TPOT is at least the batch-1 step; the TTFT floor holds for the median prompt only, since the
    # tail depends on the length distribution, which the window's mean cannot show.
    if result.target.metric is LatencyMetric.TPOT:
        return found.reachable_tpot_ms if reachable else found.tpot_ms
    if result.target.metric is LatencyMetric.TTFT and result.target.percentile == 50:
        return found.reachable_ttft_ms if reachable else found.ttft_ms
    return 0.0


def _shared_token_share(workload: WorkloadSpec | None) -> float:
    """Fraction of prompt tokens that belong to shared prefixes (what a perfect prefix cache could hit)."""
    if workload is None or not workload.shared_prefix_tokens or not workload.shared_prefix_share:
        return 0.0
    mean_prompt = workload.prompt.p50 * 1.1  # lognormal mean is a little above the median for these spreads
    return min(1.0, workload.shared_prefix_share * workload.shared_prefix_tokens / mean_prompt)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"
