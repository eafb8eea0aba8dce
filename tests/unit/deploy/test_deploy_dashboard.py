"""The Grafana dashboard queries only metrics the runtimes expose, every query is valid PromQL (promtool), the SLO
targets are drawn on the TTFT and TPOT panels, and slotune's changes are annotations."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpu_runtime.metrics import ConfigInfo
from slotune.knobs import Engine
from slotune.metrics.names import counter_sample, names_for

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "slotune-dashboard.json").read_text())
VARIABLES = {"$__rate_interval": "1m", "$namespace": "demo", "$model": ".*", "$ttft_slo_ms": "500",
             "$tpot_slo_ms": "50"}
KUBE_STATE_METRICS = {"kube_deployment_metadata_generation"}


def panels() -> list[dict]:
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def panel(title_start: str) -> dict:
    return next(p for p in panels() if p["title"].startswith(title_start))


def exprs() -> list[str]:
    panel_exprs = [t["expr"] for p in panels() for t in p["targets"]]
    return panel_exprs + [a["expr"] for a in DASHBOARD["annotations"]["list"] if "expr" in a]


def substitute(expr: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown variable in {expr}"
    return expr


def exposed_names() -> set[str]:
    """Sample names the runtimes expose for the roles slotune reads, plus the live-config info gauge."""
    names = names_for(Engine.VLLM)
    exposed = {"vllm:cache_config_info"}
    for field in dataclasses.fields(names):
        value = getattr(names, field.name)
        if field.name == "histograms":
            exposed |= {f"{h}_{suffix}" for h in value.values() for suffix in ("bucket", "sum", "count")}
        elif isinstance(value, str) and value.startswith("vllm:"):
            exposed |= {value, counter_sample(value)}
    return exposed


def test_queries_use_only_exposed_metric_names() -> None:
    used = {name for expr in exprs() for name in re.findall(r"\b(vllm:[a-z_]+|kube_[a-z_]+)", expr)}
    assert used - exposed_names() - KUBE_STATE_METRICS == set()
    assert len(used) >= 15


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool comes with Prometheus (hack/install-system-deps.sh)"
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"slotune:dashboard_query_{i}", "expr": substitute(e)} for i, e in enumerate(exprs())]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs())} rules found" in result.stdout


@pytest.mark.parametrize(("title", "histogram", "slo_variable"), [
    ("Time to first token", "vllm:time_to_first_token_seconds_bucket", "ttft_slo_ms"),
    ("Time per output token", "vllm:inter_token_latency_seconds_bucket", "tpot_slo_ms"),
])
def test_latency_panels_show_percentiles_and_the_slo_line(title: str, histogram: str, slo_variable: str) -> None:
    targets = panel(title)["targets"]
    quantiles = {q for t in targets for q in re.findall(rf"histogram_quantile\((0\.\d+), .*{histogram}", t["expr"])}
    assert quantiles == {"0.5", "0.95", "0.99"}
    slo = [t for t in targets if t["legendFormat"] == "SLO target"]
    assert [t["expr"] for t in slo] == [f"vector(${slo_variable} / 1000)"]  # panel unit is seconds
    assert panel(title)["fieldConfig"]["defaults"]["unit"] == "s"
    variable = next(v for v in DASHBOARD["templating"]["list"] if v["name"] == slo_variable)
    assert float(variable["current"]["value"]) > 0


@pytest.mark.parametrize(("title", "metrics"), [
    ("Where a request's time goes", ("request_queue_time", "request_prefill_time", "request_decode_time")),
    ("Prefix-cache hit rate", ("prefix_cache_hits_total", "prefix_cache_queries_total")),
    ("Speculative decoding", ("spec_decode_num_accepted_tokens_total", "spec_decode_num_draft_tokens_total")),
    ("KV-cache usage", ("kv_cache_usage_perc",)),
    ("Running and waiting", ("num_requests_running", "num_requests_waiting")),
])
def test_breakdown_and_knob_panels_read_their_metrics(title: str, metrics: tuple[str, ...]) -> None:
    text = " ".join(t["expr"] for t in panel(title)["targets"])
    for metric in metrics:
        assert f"vllm:{metric}" in text


def test_config_changes_are_annotations_whose_text_uses_the_runtimes_config_labels() -> None:
    annotations = {a["name"]: a for a in DASHBOARD["annotations"]["list"]}
    change = annotations["slotune config change"]
    assert change["enable"] is True and "vllm:cache_config_info" in change["expr"] and "offset" in change["expr"]
    labels = set(re.findall(r"\{\{(\w+)\}\}", change["textFormat"])) - {"pod"}
    assert labels <= {f.name for f in dataclasses.fields(ConfigInfo)}
    assert "kube_deployment_metadata_generation" in annotations["runtime rollout"]["expr"]


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in DASHBOARD["panels"]:
        box = p["gridPos"]
        assert box["x"] + box["w"] <= 24
        area = {(x, y) for x in range(box["x"], box["x"] + box["w"]) for y in range(box["y"], box["y"] + box["h"])}
        assert not area & cells, f"{p['title']} overlaps another panel"
        cells |= area
