"""The Helm chart lints clean, renders the operator the contract describes, and refuses bad values by name."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from slotune.api import parse_tunedmodel

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "slotune"
CONTRACT_ENV = {
    "SLOTUNE_PROMETHEUS_URL", "SLOTUNE_RUNTIME_IMAGE", "SLOTUNE_RUNTIME_IMAGE_CPU", "SLOTUNE_VLLM_IMAGE",
    "SLOTUNE_WATCH_NAMESPACES", "SLOTUNE_PEERING", "SLOTUNE_LOG_LEVEL", "SLOTUNE_ADMIN_TRANSPORT",
    "SLOTUNE_ALLOWED_BUILTIN_IMAGES", "SLOTUNE_ALLOWED_VLLM_IMAGES", "SLOTUNE_ALLOW_EXTRA_ARGS",
    "SLOTUNE_ALLOW_REMOTE_CODE", "SLOTUNE_NETWORK_POLICY_CLIENTS", "SLOTUNE_UNSCHEDULABLE_GRACE_S",
    "SLOTUNE_FIT_RETRY_S", "SLOTUNE_FIT_RETRY_MAX_S", "SLOTUNE_ROLLOUT_TIMEOUT_S",
}


def helm(helm_binary: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm_binary), *args], check=check, capture_output=True, text=True)


def render(helm_binary: Path, *values: str) -> list[dict]:
    out = helm(helm_binary, "template", "slotune", str(CHART), "--namespace", "slotune-system", *values).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def one(objects: list[dict], kind: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, got {len(matches)}"
    return matches[0]


def operator_container(objects: list[dict]) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_helm_lint_strict_is_clean(helm_binary: Path) -> None:
    result = helm(helm_binary, "lint", "--strict", str(CHART), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


def test_default_render_has_the_operator_objects_and_nothing_else(helm_binary: Path) -> None:
    kinds = sorted(o["kind"] for o in render(helm_binary))
    assert kinds == ["ClusterKopfPeering", "ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


def test_crds_render_only_with_include_crds(helm_binary: Path) -> None:
    crds = [o for o in render(helm_binary, "--include-crds") if o["kind"] == "CustomResourceDefinition"]
    names = sorted(o["metadata"]["name"] for o in crds)
    assert names == ["clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev", "tunedmodels.slotune.io"]


def test_operator_runs_non_root_read_only_with_the_contract_env(helm_binary: Path) -> None:
    objects = render(helm_binary)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(objects)
    assert container["command"] == ["slotune", "operator"]
    assert set(env_of(container)) == CONTRACT_ENV
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    # Nothing ties the operator to particular nodes unless the user asks.
    assert not {"nodeSelector", "tolerations", "affinity"} & set(pod)


def test_values_reach_the_operator_environment(helm_binary: Path) -> None:
    container = operator_container(render(
        helm_binary,
        "--set", "prometheus.url=http://prometheus-operated.monitoring:9090",
        "--set", "runtime.image=registry.example/rt:1", "--set", "runtime.imageCpu=registry.example/rt:1-cpu",
        "--set", "runtime.vllmImage=registry.example/vllm:2", "--set", "logLevel=DEBUG",
        "--set", "peering.name=team-a", "--set", "image.tag=9.9.9", "--set", "replicas=2",
        "--set", "adminTransport=proxy", "--set", "networkPolicy.create=false",
    ))
    assert env_of(container) == {
        "SLOTUNE_PROMETHEUS_URL": "http://prometheus-operated.monitoring:9090",
        "SLOTUNE_RUNTIME_IMAGE": "registry.example/rt:1", "SLOTUNE_RUNTIME_IMAGE_CPU": "registry.example/rt:1-cpu",
        "SLOTUNE_VLLM_IMAGE": "registry.example/vllm:2", "SLOTUNE_WATCH_NAMESPACES": "", "SLOTUNE_PEERING": "team-a",
        "SLOTUNE_LOG_LEVEL": "DEBUG", "SLOTUNE_ADMIN_TRANSPORT": "proxy",
        "SLOTUNE_ALLOWED_BUILTIN_IMAGES": "ghcr.io/slotune/runtime", "SLOTUNE_ALLOWED_VLLM_IMAGES": "vllm/vllm-openai",
        "SLOTUNE_ALLOW_EXTRA_ARGS": "true", "SLOTUNE_ALLOW_REMOTE_CODE": "false", "SLOTUNE_NETWORK_POLICY_CLIENTS": "",
        "SLOTUNE_UNSCHEDULABLE_GRACE_S": "30", "SLOTUNE_FIT_RETRY_S": "600", "SLOTUNE_FIT_RETRY_MAX_S": "3600",
        "SLOTUNE_ROLLOUT_TIMEOUT_S": "600",
    }
    assert container["image"] == "ghcr.io/slotune/operator:9.9.9"


def test_watched_namespaces_get_one_kopf_peering_each_instead_of_the_cluster_one(helm_binary: Path) -> None:
    objects = render(helm_binary, "--set", "watchNamespaces={team-a,team-b}")
    assert env_of(operator_container(objects))["SLOTUNE_WATCH_NAMESPACES"] == "team-a,team-b"
    peerings = [o for o in objects if o["kind"] in ("KopfPeering", "ClusterKopfPeering")]
    assert [(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in peerings] == [
        ("KopfPeering", "team-a", "slotune"), ("KopfPeering", "team-b", "slotune")]


def test_scheduling_values_are_rendered_when_set(helm_binary: Path) -> None:
    objects = render(helm_binary, "--set", "nodeSelector.type=kwok",
                     "--set", "tolerations[0].key=kwok.x-k8s.io/node", "--set", "tolerations[0].operator=Exists")
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"type": "kwok"}
    assert pod["tolerations"] == [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]


@pytest.mark.parametrize(("value", "field"), [
    ("replicas=0", "/replicas"),
    ("prometheus.url=prometheus:9090", "/prometheus/url"),
    ("logLevel=LOUD", "/logLevel"),
    ("adminTransport=ssh", "/adminTransport"),
    ("watchNamespaces={Team_A}", "/watchNamespaces/0"),
    ("runtime.image=", "/runtime/image"),
    ("rollout.fitRetrySeconds=0", "/rollout/fitRetrySeconds"),
    ("replica=2", "'replica' not allowed"),
])
def test_schema_refuses_bad_values_naming_the_field(helm_binary: Path, value: str, field: str) -> None:
    result = helm(helm_binary, "template", "slotune", str(CHART), "--set", value, check=False)
    assert result.returncode != 0
    assert field in result.stderr, result.stderr


def test_notes_example_is_a_valid_tunedmodel_and_shows_how_to_watch_it() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    block = re.search(r"cat <<YAML \| kubectl apply -f -\n(.*?)\n  YAML\n", notes, re.S)
    assert block is not None
    model = parse_tunedmodel(yaml.safe_load(textwrap.dedent(block.group(1))))
    assert model.metadata.name == "llama-8b"
    assert "kubectl get tm -w" in notes
    assert f"kubectl wait --for=condition=SLOMet tm/{model.metadata.name}" in notes
