"""`status` of a TunedModel: where tuning stands, what the last window measured, why, and what was tried.

Written by the tuning loop (`slotune.loop`) through the status subresource on Kubernetes and to a file locally, and
read back after an operator restart, so every model here is plain data: `model_dump(by_alias=True, mode="json",
exclude_none=True)` is the wire form. Latencies are milliseconds, like `spec.slo`.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from slotune.api.rules import ApiModel
from slotune.api.tuning import Knob
from slotune.knobs import RuntimeConfig
from slotune.snapshot import LatencySummary, MetricsSnapshot

MAX_HISTORY = 20


class Phase(StrEnum):
    PENDING = "Pending"
    DEPLOYING = "Deploying"
    MEASURING = "Measuring"
    TUNING = "Tuning"
    VERIFYING = "Verifying"
    CONVERGED = "Converged"
    INFEASIBLE = "Infeasible"
    DEGRADED = "Degraded"


class ConditionType(StrEnum):
    READY = "Ready"
    SLO_MET = "SLOMet"
    TUNING = "Tuning"
    METRICS_AVAILABLE = "MetricsAvailable"
    DEGRADED = "Degraded"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Verdict(StrEnum):
    BASELINE = "Baseline"
    PENDING = "Pending"
    KEPT = "Kept"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"
    WORKLOAD_SHIFT = "WorkloadShift"
    SCALED = "Scaled"  # a capacity-control step: judged by what it served, never rolled back on latency


class Verification(StrEnum):
    CANARY = "Canary"  # the candidate on one pod against its siblings over the same window
    BEFORE_AFTER = "BeforeAfter"  # the window before the change against the window after it


class Canary(ApiModel):
    """A candidate config on one pod while every other pod keeps `config` (canary verification)."""

    pod: str = Field(max_length=253, description="The pod running the candidate.")
    config: RuntimeConfig = Field(description="The candidate config that pod runs.")


class CapacityStatus(ApiModel):
    """Capacity control: the replicas the measured load needs, planned a start-up ahead, every window."""

    ready: int = Field(ge=0, description="Replicas serving.")
    starting: int = Field(ge=0, description="Replicas ordered that do not serve yet.")
    arrival_rate: float = Field(ge=0, description="Requests per second that arrived in the last window.")
    forecast_rate: float = Field(ge=0, description="Requests per second the plan sizes for, a start-up ahead.")
    per_replica_rate: float = Field(ge=0, description="Requests per second one replica serves within the SLO.")
    capacity_measured: bool = Field(description="Whether windows measured the per-replica rate (else the "
                                    "performance model's prior, corrected by earlier configs).")
    infeasible_at_rate: bool = Field(description="The load needs more replicas than maxReplicas: the most allowed "
                                     "run, and this clears when the rate falls.")
    message: str = Field(default="", max_length=1024, description="The last capacity decision and why.")


class Condition(ApiModel):
    """One aspect of the resource's state (metav1.Condition)."""

    type: ConditionType = Field(description="Ready, SLOMet, Tuning, MetricsAvailable or Degraded.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                        description="CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=32768, description="Human-readable details of the transition.")
    last_transition_time: datetime = Field(description="When the status last changed.")
    observed_generation: int | None = Field(default=None, ge=0, description="spec generation the condition is for.")


class Percentiles(ApiModel):
    """Percentiles of one latency over a window, in milliseconds."""

    p50_ms: float | None = Field(default=None, alias="p50", ge=0, description="Median, in milliseconds.")
    p95_ms: float | None = Field(default=None, alias="p95", ge=0, description="95th percentile, in milliseconds.")
    p99_ms: float | None = Field(default=None, alias="p99", ge=0, description="99th percentile, in milliseconds.")

    @classmethod
    def of(cls, summary: LatencySummary) -> Percentiles:
        return cls(p50_ms=summary.p50_ms, p95_ms=summary.p95_ms, p99_ms=summary.p99_ms)


class TargetAttainment(ApiModel):
    """The share of one window's requests within one latency target, counted rather than interpolated."""

    target: str = Field(max_length=32, description="The target, e.g. ttft_p99.")
    target_ms: float = Field(ge=0, description="The target, in milliseconds.")
    required: float = Field(ge=0, le=1, description="The share that must be within it: spec.slo.attainment for "
                            "each metric's loosest target, else the percentile's (0.95 for a p95 target).")
    attained: float = Field(ge=0, le=1, description="The share of requests within the target (failed ones "
                            "count as outside).")
    lower_bound: float | None = Field(default=None, ge=0, le=1, description="Lower confidence bound of that "
                                      "share (exact binomial, one-sided, at the loop's confidence).")
    exact: bool = Field(description="True when counted exactly (per-request samples, or a histogram edge at the "
                        "target); False when the target falls inside a histogram bucket (vLLM's fixed buckets), "
                        "where the share lies between low and high.")
    low: float | None = Field(default=None, ge=0, le=1, description="Inexact only: the share at the lower edge "
                              "of the bucket holding the target.")
    high: float | None = Field(default=None, ge=0, le=1, description="Inexact only: the share at its upper edge.")


class Observed(ApiModel):
    """What one measurement window saw."""

    window_s: float = Field(ge=0, description="Length of the window, in seconds.")
    num_requests: int = Field(ge=0, description="Requests finished in the window.")
    source: str = Field(default="prometheus", max_length=32, description="prometheus, scrape, client or simulator.")
    ttft: Percentiles = Field(default=Percentiles(), description="Time to first token.")
    tpot: Percentiles = Field(default=Percentiles(), description="Time per output token (inter-token latency).")
    e2e: Percentiles = Field(default=Percentiles(), description="End-to-end request latency.")
    queue: Percentiles = Field(default=Percentiles(), description="Time waiting before first scheduled.")
    prefill: Percentiles = Field(default=Percentiles(), description="First scheduled to first token.")
    decode: Percentiles = Field(default=Percentiles(), description="First token to last token.")
    generation_tokens_per_s: float = Field(default=0, ge=0, description="Output tokens per second, all replicas.")
    request_rate_per_s: float = Field(default=0, ge=0, description="Finished requests per second.")
    prefix_cache_hit_rate: float | None = Field(default=None, ge=0, le=1, description="Prefix cache hits / queries "
                                                "(tokens).")
    spec_acceptance_rate: float | None = Field(default=None, ge=0, le=1, description="Accepted / drafted tokens.")
    kv_cache_usage: float | None = Field(default=None, ge=0, le=1, description="Mean fraction of KV blocks in use.")
    num_running_mean: float | None = Field(default=None, ge=0, description="Mean sequences running per step "
                                           "and replica (batch occupancy).")
    num_waiting_mean: float | None = Field(default=None, ge=0, description="Mean requests queued per replica.")
    num_failed_requests: int = Field(default=0, ge=0, description="Requests rejected or failed in the window.")
    attainment: list[TargetAttainment] = Field(default=[], max_length=16, description="Per latency target, the "
                                               "share of requests within it.")

    @classmethod
    def of(cls, snapshot: MetricsSnapshot) -> Observed:
        return cls(
            window_s=snapshot.window_s, num_requests=snapshot.num_requests, source=snapshot.source.value,
            ttft=Percentiles.of(snapshot.ttft), tpot=Percentiles.of(snapshot.tpot), e2e=Percentiles.of(snapshot.e2e),
            queue=Percentiles.of(snapshot.queue), prefill=Percentiles.of(snapshot.prefill),
            decode=Percentiles.of(snapshot.decode), generation_tokens_per_s=snapshot.generation_tokens_per_s,
            request_rate_per_s=snapshot.request_rate_per_s, prefix_cache_hit_rate=snapshot.prefix_cache_hit_rate,
            spec_acceptance_rate=snapshot.spec_acceptance_rate, kv_cache_usage=snapshot.kv_cache_usage,
            num_running_mean=snapshot.num_running_mean, num_waiting_mean=snapshot.num_waiting_mean,
            num_failed_requests=snapshot.num_failed_requests,
        )


class DiagnosisReport(ApiModel):
    """The dominant bottleneck of the last window and the evidence for it."""

    bottleneck: str = Field(max_length=64, description="e.g. capacity, prefill, memory-bandwidth, prefill-"
                            "interference, none.")
    evidence: list[str] = Field(default=[], max_length=20, description="Human-readable lines with the "
                                "numbers behind the diagnosis.")
    suggestion: str = Field(default="", max_length=4096, description="What would help next, including what the "
                            "user could change (hardware, model) when tuning cannot.")
    confidence: float | None = Field(default=None, ge=0, le=1, description="How sure the diagnosis is, 0 to 1.")


class HistoryEntry(ApiModel):
    """One tuning iteration: the change tried, why, what it did, and whether it was kept."""

    iteration: int = Field(ge=0, description="Iteration number; 0 is the baseline.")
    time: datetime = Field(description="When the verdict was reached.")
    knob: Knob | None = Field(default=None, description="The knob changed; absent for the baseline.")
    change: str = Field(max_length=1024, description="The change, e.g. 'max_num_seqs 256 -> 64'.")
    reason: str = Field(default="", max_length=4096, description="The diagnosis that motivated the change.")
    before: Observed | None = Field(default=None, description="The window before the change.")
    after: Observed | None = Field(default=None, description="The window after the change.")
    config: RuntimeConfig | None = Field(default=None, description="The config the change produced.")
    verdict: Verdict = Field(description="Baseline, Pending, Kept, RolledBack, Failed (crashed or never ready), or "
                             "WorkloadShift (the measured workload moved; the reason says what, by how much, and "
                             "what was done).")
    verification: Verification | None = Field(
        default=None, description="How a Kept or RolledBack verdict was reached: Canary (the candidate on one pod "
        "against its siblings over the same window) or BeforeAfter (the window before the change against the one "
        "after it).")


class TunedModelStatus(ApiModel):
    """Where tuning stands. Written by slotune through the status subresource; never edit it by hand."""

    phase: Phase = Field(default=Phase.PENDING, description="Pending, Deploying, Measuring, Tuning, Verifying, "
                         "Converged, Infeasible or Degraded.")
    slo_met: bool | None = Field(default=None, description="Whether the last window met every SLO target.")
    message: str = Field(default="", max_length=4096, description="One line on what is happening and why.")
    iteration: int = Field(default=0, ge=0, description="Tuning iterations done so far.")
    observed_generation: int | None = Field(default=None, ge=0, description="spec generation last acted on.")
    conditions: list[Condition] = Field(
        default=[], max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, SLOMet, Tuning, MetricsAvailable and Degraded.",
    )
    observed: Observed | None = Field(default=None, description="The last measurement window.")
    diagnosis: DiagnosisReport | None = Field(default=None, description="Why the last window missed (or met) the SLO.")
    config: RuntimeConfig | None = Field(default=None, description="The config running now (during a canary: on "
                                         "every pod but the canary's).")
    canary: Canary | None = Field(default=None, description="The canary being verified: its pod and config.")
    capacity: CapacityStatus | None = Field(default=None, description="Capacity control, when it owns replicas "
                                            "(replicas among tuning.knobs and maxReplicas above minReplicas).")
    best_config: RuntimeConfig | None = Field(
        default=None, description="The closest config to the SLO found so far; the one kept when Infeasible."
    )
    history: list[HistoryEntry] = Field(
        default=[], max_length=MAX_HISTORY, description=f"The last {MAX_HISTORY} iterations, oldest first."
    )
    kopf: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        description="Bookkeeping of the kopf framework the operator runs on.",
    )

    def condition(self, kind: ConditionType) -> Condition | None:
        return next((c for c in self.conditions if c.type is kind), None)
