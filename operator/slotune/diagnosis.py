"""Diagnosis: from one window's breakdown to the dominant bottleneck, with the numbers behind it.

The rules are DESIGN.md's workflow step 2, applied to the SLO targets the window violates:
- queue time dominates TTFT -> capacity;
- prefill dominates TTFT -> prefix caching off or ineffective (hit rate well below the shared-prefix share), else
  prefill (token budget, or the hardware);
- TPOT tail high while its median is fine -> prefill interference;
- TPOT high throughout -> decode bandwidth.
The roofline of the declared accelerator gives the floor each metric cannot go below with the current weights, so the
diagnosis can tell a badly configured deployment from one whose targets are physically out of reach.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from slotune.api.status import DiagnosisReport
from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.slo import SLOSpec, TargetResult
from slotune.snapshot import LatencyMetric, MetricsSnapshot
from slotune.workload import WorkloadSpec

QUEUE_DOMINATES = 0.5  # queue share of TTFT at the violated percentile
TAIL_RATIO = 1.6  # TPOT p99 / p50 above this, with the median fine, is a tail problem
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
class Floors:
    """What the roofline says the current weights on this hardware can at best do, in milliseconds."""

    tpot_ms: float  # one sequence decoding alone at the window's mean context
    ttft_ms: float  # the window's mean prompt prefilled alone, shared prefix reused if caching could


@dataclass(frozen=True)
class Diagnosis:
    bottleneck: Bottleneck
    evidence: tuple[str, ...]
    confidence: float
    violated: tuple[TargetResult, ...]
    floors: Floors
    out_of_reach: tuple[str, ...]  # violated targets below the floor: no knob short of the weights can meet them

    @property
    def primary(self) -> TargetResult | None:
        """The worst violated target (largest observed / target)."""
        return max(self.violated, key=lambda r: r.ratio, default=None)

    def report(self, suggestion: str = "") -> DiagnosisReport:
        return DiagnosisReport(bottleneck=self.bottleneck.value, evidence=list(self.evidence)[:20],
                               suggestion=suggestion, confidence=round(self.confidence, 3))


def diagnose(snapshot: MetricsSnapshot, config: RuntimeConfig, slo: SLOSpec, deployment: Deployment,
             workload: WorkloadSpec | None = None) -> Diagnosis:
    """The dominant bottleneck of the window against the SLO."""
    results = slo.evaluate(snapshot)
    violated = tuple(r for r in results if not r.met)
    floors = _floors(snapshot, config, deployment, workload)
    out_of_reach = tuple(r.target.name for r in violated if r.target.target_ms < _floor_of(r, floors))
    confidence = min(1.0, snapshot.num_requests / FULL_CONFIDENCE_SAMPLES)
    if not violated:
        lines = tuple(f"{r.target.name} {_ms(r.observed_ms)} <= target {r.target.target_ms:g} ms" for r in results)
        return Diagnosis(Bottleneck.NONE, lines, confidence, (), floors, ())
    # A target out of physical reach decides the case; otherwise first-token latency comes first, since queueing
    # and prefill fixes usually change TPOT too.
    unreachable = [r for r in violated if r.target.name in out_of_reach]
    latency_first = [r for r in violated if r.target.metric is not LatencyMetric.TPOT]
    worst = max(unreachable or latency_first or violated, key=lambda r: r.ratio)
    if worst.target.metric is LatencyMetric.TPOT:
        bottleneck, lines = _decode_rule(snapshot, config, slo, floors)
    else:
        bottleneck, lines = _first_token_rule(snapshot, config, worst, floors, workload)
    head = f"{worst.target.name} {_ms(worst.observed_ms)} > target {worst.target.target_ms:g} ms"
    lines = (head, *lines, *(f"{name} is below the roofline floor of the current weights" for name in out_of_reach))
    return Diagnosis(bottleneck, lines, confidence, violated, floors, out_of_reach)


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
    median_target = slo.tpot.p50 if slo.tpot is not None and slo.tpot.p50 is not None else None
    median_fine = p50 <= (median_target if median_target is not None else p99 / TAIL_RATIO)
    tail = p99 / p50 if p50 > 0 else 0.0
    lines = [f"TPOT p50 {p50:.1f} ms, p99 {p99:.1f} ms (tail x{tail:.2f})"]
    if itl50 and itl99:
        lines.append(f"inter-token p50 {itl50:.1f} ms, p99 {itl99:.1f} ms")
    itl_tail = itl99 / itl50 if itl50 and itl99 else 0.0
    if median_fine and (tail >= TAIL_RATIO or itl_tail >= ITL_TAIL_RATIO):
        lines.append(f"chunked prefill {'on' if config.enable_chunked_prefill else 'off'}, token budget "
                     f"{config.max_num_batched_tokens}: long prefill steps stall decodes")
        return Bottleneck.PREFILL_INTERFERENCE, tuple(lines)
    lines.append(f"roofline floor {floors.tpot_ms:.1f} ms per token at batch 1; running "
                 f"{snapshot.num_running_mean or 0:.1f} sequences on average")
    return Bottleneck.DECODE_BANDWIDTH, tuple(lines)


def _floors(snapshot: MetricsSnapshot, config: RuntimeConfig, deployment: Deployment,
            workload: WorkloadSpec | None) -> Floors:
    step = deployment.step_model(config)
    prompt = round(snapshot.mean_prompt_tokens or (workload.prompt.p50 if workload else 1))
    context = prompt + (snapshot.mean_generation_tokens or 0.0) / 2
    cached = round(prompt * _shared_token_share(workload)) if config.enable_prefix_caching else 0
    return Floors(step.decode_step_s(1, context) * 1000.0, step.prefill_s(prompt, min(cached, prompt - 1)) * 1000.0)


def _floor_of(result: TargetResult, floors: Floors) -> float:
    # Every request's TPOT is at least the batch-1 step; the TTFT floor holds for the median prompt only, since the
    # tail depends on the length distribution, which the window's mean cannot show.
    if result.target.metric is LatencyMetric.TPOT:
        return floors.tpot_ms
    if result.target.metric is LatencyMetric.TTFT and result.target.percentile == 50:
        return floors.ttft_ms
    return 0.0


def _shared_token_share(workload: WorkloadSpec | None) -> float:
    """Fraction of prompt tokens that belong to shared prefixes (what a perfect prefix cache could hit)."""
    if workload is None or not workload.shared_prefix_tokens or not workload.shared_prefix_share:
        return 0.0
    mean_prompt = workload.prompt.p50 * 1.1  # lognormal mean is a little above the median for these spreads
    return min(1.0, workload.shared_prefix_share * workload.shared_prefix_tokens / mean_prompt)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"
