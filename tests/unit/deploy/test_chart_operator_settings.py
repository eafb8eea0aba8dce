"""What the chart hands the operator is what the operator reads: the rendered environment loads into
OperatorSettings, the probes hit the operator's liveness endpoint, and a vLLM TunedModel rendered with those settings
runs the chart's vLLM image with vLLM's arguments."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from slotune.api import parse_tunedmodel
from slotune.knobs import RuntimeConfig, SpeculativeConfig, SpeculativeMethod
from slotune.manifests.resources import build_deployment
from slotune.settings import AdminTransport, OperatorSettings, load_settings

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "slotune"


def operator_container(helm_binary: Path, *values: str) -> dict:
    out = subprocess.run([str(helm_binary), "template", "slotune", str(CHART), *values],
                         check=True, capture_output=True, text=True).stdout
    deployment = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def settings_from_chart(helm_binary: Path, *values: str) -> OperatorSettings:
    container = operator_container(helm_binary, *values)
    return load_settings(environ={e["name"]: e["value"] for e in container["env"]})


def test_default_chart_gives_the_operators_own_defaults(helm_binary: Path) -> None:
    assert settings_from_chart(helm_binary) == OperatorSettings()


def test_chart_values_become_operator_settings(helm_binary: Path) -> None:
    settings = settings_from_chart(
        helm_binary, "--set", "watchNamespaces={team-a,team-b}", "--set", "adminTransport=proxy",
        "--set", "prometheus.url=http://prometheus-operated.monitoring:9090", "--set", "logLevel=DEBUG")
    assert settings.watch_namespaces == ("team-a", "team-b")
    assert settings.admin_transport is AdminTransport.PROXY
    assert settings.prometheus_url == "http://prometheus-operated.monitoring:9090"
    assert settings.log_level == "DEBUG"


def test_rollout_values_become_the_fit_and_rollout_settings(helm_binary: Path) -> None:
    settings = settings_from_chart(
        helm_binary, "--set", "rollout.unschedulableGraceSeconds=45", "--set", "rollout.fitRetrySeconds=120",
        "--set", "rollout.fitRetryMaxSeconds=900", "--set", "rollout.timeoutSeconds=1200")
    assert (settings.unschedulable_grace_s, settings.fit_retry_s, settings.fit_retry_max_s,
            settings.rollout_timeout_s) == (45, 120, 900, 1200)


def test_probes_hit_the_operators_liveness_endpoint(helm_binary: Path) -> None:
    container = operator_container(helm_binary)
    endpoint = urlsplit(OperatorSettings().liveness_endpoint)
    port = next(p for p in container["ports"] if p["name"] == container["livenessProbe"]["httpGet"]["port"])
    assert port["containerPort"] == endpoint.port
    assert container["livenessProbe"]["httpGet"]["path"] == endpoint.path
    assert container["readinessProbe"]["httpGet"] == container["livenessProbe"]["httpGet"]


def test_a_vllm_tunedmodel_runs_the_charts_vllm_image_with_vllm_arguments(helm_binary: Path) -> None:
    settings = settings_from_chart(helm_binary, "--set", "runtime.vllmImage=registry.example/vllm-openai:v0.11.0")
    tm = parse_tunedmodel({
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "0000-uid"},
        "spec": {"model": {"name": "llama", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
                 "hardware": {"accelerator": "nvidia-h100-80gb", "count": 2}, "slo": {"ttft": {"p99": 500}},
                 "runtime": {"engine": "vllm"}},
    })
    speculative = SpeculativeConfig(method=SpeculativeMethod.NGRAM, num_speculative_tokens=4)
    config = RuntimeConfig(max_num_seqs=64, enable_prefix_caching=False, speculative=speculative)
    runtime = build_deployment(tm, config, settings)["spec"]["template"]["spec"]["containers"][0]
    assert runtime["image"] == "registry.example/vllm-openai:v0.11.0"
    assert runtime["command"] == ["vllm", "serve"]
    args = runtime["args"]
    assert args[0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert "--max-num-seqs=64" in args and "--no-enable-prefix-caching" in args
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    (spec_arg,) = [a for a in args if a.startswith("--speculative-config=")]
    speculative_json = json.loads(spec_arg.split("=", 1)[1])
    assert (speculative_json["method"], speculative_json["num_speculative_tokens"]) == ("ngram", 4)
    assert "--admin-token-file" not in " ".join(args)  # vLLM has no admin API: the restart path
