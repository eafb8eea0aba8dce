"""slo.attainment read from a real runtime's /metrics (issue 18, item 2): local mode starts the runtime with histogram
edges at the SLO targets, the Tuner judges server-side windows (the operator's view: bucket counts, no samples), the
share within each target is a count at an edge, and a target inside one of vLLM's buckets is bracketed by its edges.

The runtime is the builtin one on CPU with its tiny model, started by local mode (`LocalRun`), under a closed loop
of 4 clients so the outcome does not depend on the machine's speed; the loose targets hold on any machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from slotune.api import Phase, TunedModel, parse_tunedmodel
from slotune.knobs import Engine
from slotune.loadgen.runner import RunPlan, run_workload
from slotune.local.command import LocalRun
from slotune.local.replicas import LocalReplicas
from slotune.metrics.names import names_for
from slotune.metrics.scrape import scrape_snapshot
from slotune.slo import SLOSpec, attained
from slotune.snapshot import MetricsSnapshot
from slotune.workload import WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
TARGETS_S = {"ttft": 7.777, "tpot": 3.333, "e2e": 9.999}  # off vLLM's edges: only --slo-bucket-edges puts them there
FAMILIES = {"ttft": "vllm:time_to_first_token_seconds", "tpot": "vllm:request_time_per_output_token_seconds",
            "e2e": "vllm:e2e_request_latency_seconds"}


class ServerWindows:
    """A `MeasurementSource` reading each window from the runtimes' /metrics before and after it, as the operator
    reads Prometheus (histograms only), while the workload's closed loop runs against them."""

    def __init__(self, replicas: LocalReplicas, workload: WorkloadSpec, model: str) -> None:
        self.replicas, self.workload, self.model = replicas, workload, model
        self.windows: list[MetricsSnapshot] = []

    def measure(self, window_s: float) -> MetricsSnapshot:
        urls = tuple(self.replicas.urls)

        def drive(seconds: float) -> None:
            plan = RunPlan(urls=urls, model=self.model, duration_s=seconds, warmup_requests=0,
                           seed=len(self.windows), show_progress=False)
            asyncio.run(run_workload(self.workload, plan))

        names = names_for(Engine.BUILTIN)
        window = scrape_snapshot([f"{url}/metrics" for url in urls], window_s, names, {names.model_label: self.model},
                                 sleep=drive)
        self.windows.append(window)
        return window


def _model(tmp_path: Path) -> TunedModel:
    body = yaml.safe_load((ROOT / "examples" / "local-tiny.yaml").read_text())
    body["spec"]["runtime"]["config"] = {"maxNumSeqs": 8, "maxNumBatchedTokens": 512}
    body["spec"]["slo"] = {metric: {"p99": seconds * 1000} for metric, seconds in TARGETS_S.items()}
    body["spec"]["slo"]["attainment"] = 0.9
    body["spec"]["workload"] |= {"concurrency": 4, "promptTokens": {"p50": 32, "p99": 64},
                                 "outputTokens": {"p50": 8, "p99": 16}}
    body["spec"]["tuning"] |= {"knobs": ["replicas"], "windowSeconds": 5, "minSamples": 20, "warmupSeconds": 0}
    return parse_tunedmodel(body)


@pytest.fixture
def local_run(tmp_path: Path) -> Iterator[LocalRun]:
    model = _model(tmp_path)
    run = LocalRun(model, model.spec.model.source, tmp_path / "run", prometheus_url=None, resume=False)
    try:
        assert run.start() is None
        yield run
    finally:
        run.stop()


def _cumulative_buckets(url: str, family: str) -> dict[float, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = next(f for f in text_string_to_metric_families(text) if f.name == family)
    return {float(s.labels["le"]): s.value for s in found.samples if s.name == f"{family}_bucket"}


def test_attainment_is_counted_at_edges_the_runtime_exposes_and_bracketed_inside_vllms_buckets(
        local_run: LocalRun) -> None:
    assert local_run.model.spec.workload is not None
    source = ServerWindows(local_run.replicas, local_run.model.spec.workload, local_run.model.spec.model.name)
    tuner = local_run.tuner()
    tuner.source = source
    state = tuner.run(max_windows=6)
    assert state.phase is Phase.CONVERGED, state.message
    assert "within" in state.message and "90.00% required" in state.message
    assert state.measured.observed is not None
    rows = {r.target: r for r in state.measured.observed.attainment}
    assert set(rows) == {"ttft_p99", "tpot_p99", "e2e_p99"}
    assert all(r.exact and r.required == 0.9 and r.lower_bound is not None for r in rows.values())
    (url,) = local_run.replicas.urls
    for metric, family in FAMILIES.items():  # the edge is in /metrics, and every request so far is within it
        buckets = _cumulative_buckets(url, family)
        assert TARGETS_S[metric] in buckets and buckets[TARGETS_S[metric]] == buckets[float("inf")] > 0
        assert rows[f"{metric}_p99"].attained == 1.0

    # The last window's real TTFT buckets: a target inside the bucket that holds the median is bracketed by the
    # shares at its two edges (vLLM's case); a target at an edge is an exact count that decides attainment.
    window = source.windows[-1]
    histogram = window.ttft.histogram
    assert histogram is not None and window.ttft.p50_ms is not None
    low_s, high_s = histogram.bucket_of(window.ttft.p50_ms / 1000.0)
    inside = attained(window.ttft, (low_s + high_s) / 2 * 1000.0)
    at_edge = attained(window.ttft, high_s * 1000.0)
    assert inside is not None and at_edge is not None and not inside.exact and at_edge.exact
    assert inside.fraction_low < 0.5 <= inside.fraction_high == at_edge.fraction
    assert inside.fraction_low < inside.fraction < inside.fraction_high
    share = at_edge.fraction
    meeting = SLOSpec.model_validate({"ttft": {"p99": high_s * 1000.0}, "attainment": share})
    assert meeting.is_met(window)
    if share < 1.0:
        missing = SLOSpec.model_validate({"ttft": {"p99": high_s * 1000.0}, "attainment": (1.0 + share) / 2})
        assert not missing.is_met(window)
