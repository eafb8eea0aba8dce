"""`helm install` into the real test control plane: the CRDs are established, the operator Deployment becomes
Available (kwok marks its pod Ready without running the container), the API server's RBAC authorizer gives the
operator's ServiceAccount what the contract lists and no more, and every rendered manifest passes a server-side
dry run (chart with non-default values, the kustomize base, the NOTES example TunedModel)."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import kwok_cluster
from slotune.api import parse_tunedmodel
from slotune.knobs import RuntimeConfig
from slotune.manifests.resources import build_deployment, build_secret, build_service
from slotune.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "slotune"
NAMESPACE = "slotune-system"
OPERATOR_SA = f"system:serviceaccount:{NAMESPACE}:slotune-operator"
CRDS = ("tunedmodels.slotune.io", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")


def helm(helm_binary: Path, kube: kwok_cluster.Cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm_binary), "--kubeconfig", str(kube.kubeconfig), *args],
                          check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def installed(kube: kwok_cluster.Cluster, helm_binary: Path) -> Iterator[kwok_cluster.Cluster]:
    helm(helm_binary, kube, "install", "slotune", str(CHART), "--namespace", NAMESPACE, "--create-namespace",
         "--wait", "--timeout", "180s")
    try:
        yield kube
    finally:
        helm(helm_binary, kube, "uninstall", "slotune", "--namespace", NAMESPACE, "--wait", "--timeout", "120s")


def dry_run_server(kube: kwok_cluster.Cluster, manifests: str) -> str:
    result = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=manifests, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_install_establishes_the_crds(installed: kwok_cluster.Cluster) -> None:
    installed.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{name}" for name in CRDS))
    resources = installed.kubectl("api-resources", "--api-group=slotune.io", "-o", "name").stdout.split()
    assert resources == ["tunedmodels.slotune.io"]


def test_operator_deployment_becomes_available_on_a_kwok_node(installed: kwok_cluster.Cluster) -> None:
    installed.kubectl("wait", "--for=condition=Available", "--timeout=120s", "-n", NAMESPACE,
                      "deployment/slotune-operator")
    deployment = json.loads(installed.kubectl("get", "-n", NAMESPACE, "deployment/slotune-operator",
                                              "-o", "json").stdout)
    assert deployment["status"]["readyReplicas"] == 1
    pods = json.loads(installed.kubectl("get", "pods", "-n", NAMESPACE, "-l",
                                        "app.kubernetes.io/component=operator", "-o", "json").stdout)["items"]
    assert [p["status"]["phase"] for p in pods] == ["Running"]
    assert pods[0]["spec"]["nodeName"] in {node.name for node in installed.nodes}
    assert pods[0]["spec"]["serviceAccountName"] == "slotune-operator"


def test_cluster_peering_exists_for_the_operator(installed: kwok_cluster.Cluster) -> None:
    peering = json.loads(installed.kubectl("get", "clusterkopfpeering", "slotune", "-o", "json").stdout)
    assert peering["metadata"]["labels"]["app.kubernetes.io/instance"] == "slotune"


def operator_may(kube: kwok_cluster.Cluster, verb: str, group: str, resource: str, subresource: str = "") -> bool:
    """The API server's own answer (a SubjectAccessReview) for the operator's ServiceAccount, cluster-wide."""
    review = {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": OPERATOR_SA, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
                 "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                        "subresource": subresource}},
    }
    answer = json.loads(kube.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review)).stdout)
    return answer["status"]["allowed"]


@pytest.mark.parametrize(("verb", "group", "resource", "subresource", "allowed"), [
    ("patch", "slotune.io", "tunedmodels", "", True),
    ("update", "slotune.io", "tunedmodels", "status", True),
    ("delete", "slotune.io", "tunedmodels", "status", False),
    ("create", "slotune.io", "tunedmodels", "", False),
    ("delete", "slotune.io", "tunedmodels", "", False),
    ("delete", "apps", "deployments", "", True),
    ("create", "apps", "statefulsets", "", False),
    ("create", "", "secrets", "", True),
    ("create", "", "pods", "proxy", True),
    ("delete", "", "pods", "", False),
    ("create", "", "pods", "exec", False),
    ("create", "monitoring.coreos.com", "servicemonitors", "", True),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", "", False),
    ("patch", "kopf.dev", "clusterkopfpeerings", "", True),
    ("create", "kopf.dev", "clusterkopfpeerings", "", False),
    ("create", "coordination.k8s.io", "leases", "", True),
    ("create", "events.k8s.io", "events", "", True),
    ("get", "", "namespaces", "", False),
    ("list", "", "nodes", "", False),
])
def test_api_server_authorizes_the_operator_as_the_contract_says(
    installed: kwok_cluster.Cluster, verb: str, group: str, resource: str, subresource: str, allowed: bool,
) -> None:
    assert operator_may(installed, verb, group, resource, subresource) is allowed


def test_chart_with_non_default_values_passes_a_server_side_dry_run(
    installed: kwok_cluster.Cluster, helm_binary: Path,
) -> None:
    for namespace in ("slotune-dryrun", "team-a"):
        installed.kubectl("create", "namespace", namespace, check=False)
    rendered = helm(
        helm_binary, installed, "template", "dryrun", str(CHART), "--namespace", "slotune-dryrun",
        "--set", "watchNamespaces={team-a}", "--set", "peering.name=dryrun", "--set", "replicas=2",
        "--set", "prometheus.url=http://prometheus-operated.monitoring:9090", "--set", "nodeSelector.type=kwok",
        "--set", "tolerations[0].key=kwok.x-k8s.io/node", "--set", "tolerations[0].operator=Exists",
        "--set", "serviceAccount.annotations.team=a", "--set", "podLabels.team=a",
    ).stdout
    out = dry_run_server(installed, rendered)
    assert "kopfpeering.kopf.dev/dryrun created (server dry run)" in out
    assert "deployment.apps/dryrun-slotune-operator created (server dry run)" in out


def test_default_render_and_kustomize_base_pass_a_server_side_dry_run(
    installed: kwok_cluster.Cluster, helm_binary: Path,
) -> None:
    rendered = helm(helm_binary, installed, "template", "slotune", str(CHART), "--namespace", NAMESPACE,
                    "--include-crds").stdout
    assert dry_run_server(installed, rendered).count("(server dry run)") == len(
        [d for d in yaml.safe_load_all(rendered) if d])
    base = installed.kubectl("kustomize", str(ROOT / "deploy" / "kustomize" / "base")).stdout
    assert "clusterrole.rbac.authorization.k8s.io/slotune-operator" in dry_run_server(installed, base)


def test_notes_example_is_accepted_by_the_installed_crd(installed: kwok_cluster.Cluster) -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    block = re.search(r"cat <<YAML \| kubectl apply -f -\n(.*?)\n  YAML\n", notes, re.S)
    assert block is not None
    out = dry_run_server(installed, textwrap.dedent(block.group(1)))
    assert "tunedmodel.slotune.io/llama-8b created (server dry run)" in out


@pytest.mark.parametrize("engine", ["builtin", "vllm"])
def test_runtime_children_rendered_with_the_charts_settings_pass_a_server_side_dry_run(
    installed: kwok_cluster.Cluster, engine: str,
) -> None:
    deployment = json.loads(installed.kubectl("get", "-n", NAMESPACE, "deployment/slotune-operator",
                                              "-o", "json").stdout)
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    settings = load_settings(environ={e["name"]: e.get("value", "") for e in env})  # the API drops ""
    installed.kubectl("create", "namespace", "team-a", check=False)
    tm = parse_tunedmodel({
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": f"chat-{engine}", "namespace": "team-a", "uid": "0000-uid"},
        "spec": {"model": {"name": "llama", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
                 "hardware": {"accelerator": "nvidia-h100-80gb", "count": 1}, "slo": {"ttft": {"p99": 500}},
                 "runtime": {"engine": engine}},
    })
    children = [build_deployment(tm, RuntimeConfig(), settings), build_service(tm), build_secret(tm, "t0ken")]
    out = dry_run_server(installed, "\n---\n".join(json.dumps(c) for c in children))
    assert f"deployment.apps/chat-{engine}-runtime created (server dry run)" in out
