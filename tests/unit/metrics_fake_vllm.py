"""A stand-in for a vLLM-compatible server's metrics: real prometheus_client metrics with vLLM's names and buckets.

Used where the test is about reading metrics (parsing, differencing, PromQL), not about the server producing them.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10, 20, 40, 80,
                  160, 640, 2560)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10, 20, 40, 80)
LENGTH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
REQLAT_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680)


class FakeVllm:
    """vLLM's request-level metrics for one model; `finish` records one finished request."""

    def __init__(self, model: str = "tiny") -> None:
        self.registry = CollectorRegistry()
        self.model = model

        def histogram(name: str, buckets: tuple[float, ...]):
            return Histogram(name, "", ["model_name"], buckets=buckets, registry=self.registry).labels(model)

        def counter(name: str):
            return Counter(name, "", ["model_name"], registry=self.registry).labels(model)

        self.ttft = histogram("vllm:time_to_first_token_seconds", TTFT_BUCKETS_S)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds", ITL_BUCKETS_S)
        self.itl = histogram("vllm:inter_token_latency_seconds", ITL_BUCKETS_S)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", REQLAT_BUCKETS_S)
        self.queue = histogram("vllm:request_queue_time_seconds", REQLAT_BUCKETS_S)
        self.prefill = histogram("vllm:request_prefill_time_seconds", REQLAT_BUCKETS_S)
        self.decode = histogram("vllm:request_decode_time_seconds", REQLAT_BUCKETS_S)
        self.prompt_lengths = histogram("vllm:request_prompt_tokens", LENGTH_BUCKETS)
        self.generation_lengths = histogram("vllm:request_generation_tokens", LENGTH_BUCKETS)
        self.prompt = counter("vllm:prompt_tokens")
        self.generation = counter("vllm:generation_tokens")
        self.success = Counter("vllm:request_success", "", ["model_name", "finished_reason"], registry=self.registry)
        self.queries = counter("vllm:prefix_cache_queries")
        self.hits = counter("vllm:prefix_cache_hits")
        self.preemptions = counter("vllm:num_preemptions")
        self.running = Gauge("vllm:num_requests_running", "", ["model_name"], registry=self.registry).labels(model)
        self.waiting = Gauge("vllm:num_requests_waiting", "", ["model_name"], registry=self.registry).labels(model)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "", ["model_name"], registry=self.registry).labels(model)

    def admit(self, prompt_tokens: int) -> None:
        """A request prefilled and still running: vLLM counts its prompt tokens now, its lengths when it finishes."""
        self.prompt.inc(prompt_tokens)

    def finish(self, ttft_s: float, e2e_s: float, prompt_tokens: int, output_tokens: int = 2,
               reason: str = "length", queue_s: float = 0.0, prefilled: bool = False) -> None:
        """One finished request; `prefilled`: its prompt tokens were counted by an earlier `admit`."""
        tpot_s = (e2e_s - ttft_s) / max(1, output_tokens - 1)
        self.ttft.observe(ttft_s)
        self.e2e.observe(e2e_s)
        self.queue.observe(queue_s)
        self.prefill.observe(ttft_s - queue_s)
        self.decode.observe(e2e_s - ttft_s)
        self.tpot.observe(tpot_s)
        for _ in range(output_tokens - 1):
            self.itl.observe(tpot_s)
        if not prefilled:
            self.prompt.inc(prompt_tokens)
        self.prompt_lengths.observe(prompt_tokens)
        self.generation_lengths.observe(output_tokens)
        self.generation.inc(output_tokens)
        self.success.labels(self.model, reason).inc()

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def send_text_format(handler: BaseHTTPRequestHandler, registry: CollectorRegistry) -> None:
    """Answer a scrape in the classic text format: prometheus_client 0.26 escapes ':' to '_' in sample names when
    Prometheus negotiates OpenMetrics, which would rename every vllm: metric (the runtime serves text format too).
    A scraper that gave up meanwhile (a broken pipe) is nobody's fault to report."""
    body = generate_latest(registry)
    try:
        handler.send_response(200)
        handler.send_header("Content-Type", CONTENT_TYPE_LATEST)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    except (BrokenPipeError, ConnectionResetError):
        pass
