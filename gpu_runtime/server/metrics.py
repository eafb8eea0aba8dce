"""The runtime's Prometheus metrics, with vLLM's names, types, labels and buckets (docs/facts.md#metrics).

Latencies are derived only from the engine's event timestamps (`RequestTimes`, `token_times`), never from the HTTP
layer, so a dashboard or the operator reads the same quantities from this runtime and from vLLM. Per-output and
per-request observations are made on the engine's worker thread (prometheus_client is thread-safe); gauges and the
engine's cumulative counters are read at scrape time from the latest `EngineStats` snapshot the worker publishes, and
`vllm:cache_config_info` carries the live configuration as labels so a reconfiguration shows up on the next scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gpu_runtime.engine.llm_engine import EngineStats, RequestOutput

# Bucket boundaries in seconds, copied from vLLM V1 (docs/facts.md#metrics).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                  40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                 80.0)
REQLAT_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                    480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def one_two_five_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value, as vLLM's build_1_2_5_buckets."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(buckets)
            buckets.append(value)
        exponent += 1


@dataclass(frozen=True)
class ExtraEdges:
    """Bucket edges (seconds) added to vLLM's own, at the SLO targets the operator passes (--slo-bucket-edges), so
    the fraction of requests within a target is a bucket count instead of an interpolation inside a wide bucket.
    The standard edges all stay: dashboards and `histogram_quantile` read the histograms as before."""

    ttft_s: tuple[float, ...] = ()
    itl_s: tuple[float, ...] = ()  # inter-token latency and time per output token
    e2e_s: tuple[float, ...] = ()

    @classmethod
    def parse(cls, text: str) -> ExtraEdges:
        """`ttft=0.5,tpot=0.05,e2e=2` (seconds; a metric may repeat); raises ValueError on anything else."""
        found: dict[str, list[float]] = {"ttft": [], "tpot": [], "e2e": []}
        for item in filter(None, (part.strip() for part in text.split(","))):
            metric, _, value = item.partition("=")
            if metric not in found:
                raise ValueError(f"unknown metric {metric!r} in {item!r}: use ttft, tpot or e2e")
            edge = float(value)
            if not 0 < edge < float("inf"):
                raise ValueError(f"bucket edge {item!r} must be a positive number of seconds")
            found[metric].append(edge)
        return cls(tuple(found["ttft"]), tuple(found["tpot"]), tuple(found["e2e"]))


def with_edges(standard: tuple[float, ...], extra: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(sorted(set(standard) | set(extra)))


@dataclass(frozen=True)
class ConfigInfo:
    """The live configuration shown as `vllm:cache_config_info` labels (all strings, as labels are)."""

    block_size: int
    cache_dtype: str
    num_gpu_blocks: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    speculative_config: str  # vLLM's --speculative-config JSON, or "none"
    quantization: str

    def labels(self) -> dict[str, str]:
        return {name: str(value).lower() if isinstance(value, bool) else str(value)
                for name, value in self.__dict__.items()}


def _request_histogram(name: str, doc: str, buckets: Iterable[float], registry: CollectorRegistry) -> Histogram:
    return Histogram(name, doc, ["model_name"], buckets=tuple(buckets), registry=registry)


class _StatsCollector(Collector):
    """Gauges and engine counters read from the latest EngineStats snapshot at scrape time."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats | None],
                 config: Callable[[], ConfigInfo | None]) -> None:
        self._model_name = model_name
        self._stats = stats
        self._config = config

    def collect(self) -> Iterable[Metric]:
        stats, config, labels = self._stats(), self._config(), [self._model_name]
        if stats is not None:
            yield from self._stats_metrics(stats, labels)
        if config is not None:
            info = config.labels()
            gauge = GaugeMetricFamily("vllm:cache_config_info", "Information of the live cache and scheduler config.",
                                      labels=["model_name", *info])
            gauge.add_metric([self._model_name, *info.values()], 1.0)
            yield gauge

    @staticmethod
    def _stats_metrics(stats: EngineStats, labels: list[str]) -> Iterable[Metric]:
        gauges = (("vllm:num_requests_running", "Number of requests in model execution batches.", stats.num_running),
                  ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats.num_waiting),
                  ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_cache_usage))
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric(labels, float(value))
            yield gauge
        counters = (("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.",
                     stats.prefix_cache_queries_tokens),
                    ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", stats.prefix_cache_hits_tokens),
                    ("vllm:num_preemptions", "Cumulative number of preemptions.", stats.num_preemptions),
                    ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", stats.spec_num_drafts),
                    ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", stats.spec_num_draft_tokens),
                    ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                     stats.spec_num_accepted_tokens))
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric(labels, float(value))
            yield counter
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted tokens per draft position.", labels=["model_name", "position"])
        for position, value in enumerate(stats.spec_num_accepted_tokens_per_pos):
            per_pos.add_metric([*labels, str(position)], float(value))
        yield per_pos


class RuntimeMetrics:
    """Owns the registry; the engine worker feeds it outputs, the HTTP layer renders it."""

    def __init__(self, model_name: str, max_model_len: int, extra_edges: ExtraEdges | None = None) -> None:
        disable_created_metrics()  # process-wide; vLLM does the same, dashboards never read *_created series
        self.registry = CollectorRegistry()
        self._model_name = model_name
        self._edges = extra_edges or ExtraEdges()
        self._last_event_s: dict[str, float] = {}  # request id -> time of its latest token (worker thread only)
        self._stats: EngineStats | None = None
        self._config: ConfigInfo | None = None
        self._declare(max_model_len)
        self.registry.register(_StatsCollector(model_name, lambda: self._stats, lambda: self._config))

    def _declare(self, max_model_len: int) -> None:
        reg, name = self.registry, self._model_name
        edges = self._edges
        ttft_s, itl_s = with_edges(TTFT_BUCKETS_S, edges.ttft_s), with_edges(ITL_BUCKETS_S, edges.itl_s)
        self.ttft = _request_histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token.",
                                       ttft_s, reg).labels(name)
        self.itl = _request_histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency.",
                                      itl_s, reg).labels(name)
        self.tpot = _request_histogram("vllm:request_time_per_output_token_seconds",
                                       "Histogram of time_per_output_token_seconds per request.", itl_s,
                                       reg).labels(name)
        self.e2e = _request_histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in "
                                      "seconds.", with_edges(REQLAT_BUCKETS_S, edges.e2e_s), reg).labels(name)
        self.queue, self.prefill, self.decode, self.inference = (
            _request_histogram(f"vllm:{metric}_seconds", doc, REQLAT_BUCKETS_S, reg).labels(name)
            for metric, doc in (("request_queue_time", "Histogram of time spent in WAITING phase for request."),
                                ("request_prefill_time", "Histogram of time spent in PREFILL phase for request."),
                                ("request_decode_time", "Histogram of time spent in DECODE phase for request."),
                                ("request_inference_time", "Histogram of time spent in RUNNING phase for request.")))
        length_buckets = one_two_five_buckets(max_model_len)
        self.request_prompt_tokens = _request_histogram("vllm:request_prompt_tokens", "Number of prefill tokens "
                                                        "processed.", length_buckets, reg).labels(name)
        self.request_generation_tokens = _request_histogram("vllm:request_generation_tokens", "Number of generation "
                                                            "tokens processed.", length_buckets, reg).labels(name)
        self.iteration_tokens = _request_histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per "
                                                   "engine_step.", ITERATION_TOKEN_BUCKETS, reg).labels(name)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", ["model_name"],
                                     registry=reg).labels(name)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.",
                                         ["model_name"], registry=reg).labels(name)
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                ["model_name", "finished_reason"], registry=reg)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def set_config(self, config: ConfigInfo) -> None:
        self._config = config

    def record_step(self, stats: EngineStats, stepped: bool) -> None:
        """Publish the latest engine snapshot; count a step's tokens only when a step ran."""
        self._stats = stats
        if stepped and stats.last_step_num_tokens > 0:
            self.iteration_tokens.observe(stats.last_step_num_tokens)

    def record_output(self, output: RequestOutput) -> None:
        """One engine output event of one request: TTFT on its first tokens, ITL per later event."""
        if output.token_times:
            previous_s = self._last_event_s.get(output.request_id)
            if previous_s is None:
                self.prompt_tokens.inc(output.num_prompt_tokens)
                if output.times.first_token is not None:
                    self.ttft.observe(output.times.first_token - output.times.arrival)
            else:
                self.itl.observe(output.token_times[-1] - previous_s)
            self._last_event_s[output.request_id] = output.token_times[-1]
            self.generation_tokens.inc(len(output.new_token_ids))
        if output.finished:
            self._record_finished(output)

    def _record_finished(self, output: RequestOutput) -> None:
        self._last_event_s.pop(output.request_id, None)
        self._success.labels(self._model_name, output.finish_reason or "stop").inc()
        if output.finish_reason == "abort":
            return  # cut short by its client: its lengths and latencies describe the client, not the server
        self.request_prompt_tokens.observe(output.num_prompt_tokens)
        self.request_generation_tokens.observe(output.num_output_tokens)
        times = output.times
        if times.first_scheduled is not None:
            self.queue.observe(times.first_scheduled - times.arrival)
        if times.first_token is None or times.last_token is None:
            return
        self.e2e.observe(times.last_token - times.arrival)
        self.decode.observe(times.last_token - times.first_token)
        if times.first_scheduled is not None:
            self.prefill.observe(times.first_token - times.first_scheduled)
            self.inference.observe(times.last_token - times.first_scheduled)
        if output.num_output_tokens > 1:
            # vLLM: (e2e - ttft) / (output tokens - 1), i.e. decode time per generated token after the first.
            self.tpot.observe((times.last_token - times.first_token) / (output.num_output_tokens - 1))
