"""Histogram edges at the SLO targets: the share of requests within a target is a bucket count, read exactly.

A real runtime started as the operator starts it (`--slo-bucket-edges` rendered by slotune.manifests.resources from a
TunedModel's targets) serves real requests through the `openai` SDK; its /metrics keeps every standard vLLM edge and
adds the targets', and the count at a target's edge is exactly the requests at or under it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpu_runtime.metrics import ITL_BUCKETS_S, REQLAT_BUCKETS_S, TTFT_BUCKETS_S
from slotune.api import parse_tunedmodel
from slotune.manifests.resources import slo_bucket_edges
from tests.harness.runtime import RuntimeServer
from tests.runtime.server.conftest import MODEL_NAME
from tests.unit.api_cases import BASE


def _buckets(url: str, name: str) -> dict[float, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    family = next(f for f in text_string_to_metric_families(text) if f.name == name)
    return {float(s.labels["le"]): s.value for s in family.samples if s.name == f"{name}_bucket"}


def test_the_operator_renders_every_latency_target_as_an_edge() -> None:
    manifest = yaml.safe_load(BASE.read_text())
    manifest["spec"]["slo"] = {"ttft": {"p50": 250, "p99": 800}, "tpot": {"p99": 30}, "e2e": {"p95": 4000}}
    assert slo_bucket_edges(parse_tunedmodel(manifest).spec.slo) == "ttft=0.25,ttft=0.8,tpot=0.03,e2e=4"


def test_slo_edges_are_added_to_the_standard_ones_and_count_exactly(
    start_server: Callable[..., RuntimeServer],
) -> None:
    server = start_server("--slo-bucket-edges=ttft=0.333,tpot=0.0333,e2e=0.777")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    for _ in range(4):
        client.completions.create(model=MODEL_NAME, prompt="hello there", max_tokens=6, temperature=0)
    ttft = _buckets(server.url, "vllm:time_to_first_token_seconds")
    tpot = _buckets(server.url, "vllm:request_time_per_output_token_seconds")
    itl = _buckets(server.url, "vllm:inter_token_latency_seconds")
    e2e = _buckets(server.url, "vllm:e2e_request_latency_seconds")
    assert set(TTFT_BUCKETS_S) | {0.333} <= set(ttft)
    assert set(ITL_BUCKETS_S) | {0.0333} <= set(tpot) and set(ITL_BUCKETS_S) | {0.0333} <= set(itl)
    assert set(REQLAT_BUCKETS_S) | {0.777} <= set(e2e)
    assert ttft[float("inf")] == 4 and e2e[float("inf")] == 4
    for buckets in (ttft, tpot, itl, e2e):  # cumulative: the count at an edge is every request at or under it
        counts = [buckets[edge] for edge in sorted(buckets)]
        assert counts == sorted(counts)


@pytest.mark.parametrize("value", ["ttft=-1", "latency=0.5", "ttft=abc"])
def test_a_bad_edge_is_refused_at_start_with_one_line(value: str) -> None:
    result = subprocess.run([sys.executable, "-m", "gpu_runtime", "serve", "--model", "builtin://nano",
                             f"--slo-bucket-edges={value}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "invalid --slo-bucket-edges" in result.stderr and "Traceback" not in result.stderr
