"""Which metric names each serving engine exposes, so one reader serves them all.

The builtin runtime exposes vLLM's V1 names (docs/facts.md#metrics), so the two engines slotune deploys
(`slotune.knobs.Engine`) share one table. SGLang's names are mapped onto the same roles, with gauges where SGLang has
no counter (its cache hit rate and acceptance length), as `SGLANG_NAMES` for reading an SGLang server slotune did not
deploy. Counter names are the declared names without `_total`; `CounterName.sample` adds it, as
prometheus_client does when exposing. A role an engine does not expose is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from slotune.knobs import Engine
from slotune.snapshot import LatencyMetric


def counter_sample(name: str) -> str:
    """The exposed sample name of a counter declared as `name`."""
    return name if name.endswith("_total") else f"{name}_total"


@dataclass(frozen=True)
class MetricNames:
    """Metric names of one engine, by role."""

    model_label: str
    histograms: Mapping[LatencyMetric, str]  # latency metric -> histogram base name (seconds)
    prompt_tokens: str | None = None  # counters
    generation_tokens: str | None = None
    request_success: str | None = None
    prefix_cache_queries: str | None = None
    prefix_cache_hits: str | None = None
    num_preemptions: str | None = None
    spec_drafts: str | None = None
    spec_draft_tokens: str | None = None
    spec_accepted_tokens: str | None = None
    num_running: str | None = None  # gauges
    num_waiting: str | None = None
    kv_cache_usage: str | None = None
    prefix_cache_hit_rate: str | None = None  # gauge, only where no hit/query counters exist
    spec_accept_length: str | None = None  # gauge, only where no draft counters exist
    request_prompt_tokens: str | None = None  # per-request length histograms
    request_generation_tokens: str | None = None


_VLLM = MetricNames(
    model_label="model_name",
    histograms=MappingProxyType({
        LatencyMetric.TTFT: "vllm:time_to_first_token_seconds",
        LatencyMetric.TPOT: "vllm:request_time_per_output_token_seconds",
        LatencyMetric.ITL: "vllm:inter_token_latency_seconds",
        LatencyMetric.E2E: "vllm:e2e_request_latency_seconds",
        LatencyMetric.QUEUE: "vllm:request_queue_time_seconds",
        LatencyMetric.PREFILL: "vllm:request_prefill_time_seconds",
        LatencyMetric.DECODE: "vllm:request_decode_time_seconds",
    }),
    prompt_tokens="vllm:prompt_tokens",
    generation_tokens="vllm:generation_tokens",
    request_success="vllm:request_success",
    prefix_cache_queries="vllm:prefix_cache_queries",
    prefix_cache_hits="vllm:prefix_cache_hits",
    num_preemptions="vllm:num_preemptions",
    spec_drafts="vllm:spec_decode_num_drafts",
    spec_draft_tokens="vllm:spec_decode_num_draft_tokens",
    spec_accepted_tokens="vllm:spec_decode_num_accepted_tokens",
    num_running="vllm:num_requests_running",
    num_waiting="vllm:num_requests_waiting",
    kv_cache_usage="vllm:kv_cache_usage_perc",
    request_prompt_tokens="vllm:request_prompt_tokens",
    request_generation_tokens="vllm:request_generation_tokens",
)

# SGLang (python/sglang/srt/metrics/collector.py): per-request TPOT is not exposed, its ITL histogram is observed
# per token, which is the closest role; it has no prefill/decode split and no preemption counter.
SGLANG_NAMES = MetricNames(
    model_label="model_name",
    histograms=MappingProxyType({
        LatencyMetric.TTFT: "sglang:time_to_first_token_seconds",
        LatencyMetric.TPOT: "sglang:inter_token_latency_seconds",
        LatencyMetric.ITL: "sglang:inter_token_latency_seconds",
        LatencyMetric.E2E: "sglang:e2e_request_latency_seconds",
        LatencyMetric.QUEUE: "sglang:queue_time_seconds",
    }),
    prompt_tokens="sglang:prompt_tokens",
    generation_tokens="sglang:generation_tokens",
    num_running="sglang:num_running_reqs",
    num_waiting="sglang:num_queue_reqs",
    kv_cache_usage="sglang:token_usage",
    prefix_cache_hit_rate="sglang:cache_hit_rate",
    spec_accept_length="sglang:spec_accept_length",
)

METRIC_NAMES: Mapping[Engine, MetricNames] = MappingProxyType(
    {Engine.BUILTIN: _VLLM, Engine.VLLM: _VLLM}
)


def names_for(engine: Engine | str) -> MetricNames:
    """The names an engine exposes; "sglang" names an SGLang server (not an engine slotune deploys)."""
    return SGLANG_NAMES if engine == "sglang" else METRIC_NAMES[Engine(engine)]
