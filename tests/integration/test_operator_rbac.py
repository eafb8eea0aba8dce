"""The operator works with exactly the chart's least-privilege RBAC: it runs with a token of the chart's
ServiceAccount (bound to the chart's ClusterRole, rendered by helm), so any API call the contract forgot fails here."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.harness.kube import apply, condition, events, get, wait_for
from tests.e2e.harness.operator import OperatorProcess
from tests.integration.test_operator import tunedmodel

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "rbac-op"
SYSTEM_NAMESPACE = f"slotune-rbac-{uuid.uuid4().hex[:6]}"


def render(helm_binary: Path, *templates: str) -> list[dict]:
    shown = [arg for t in templates for arg in ("--show-only", f"templates/{t}")]
    rendered = subprocess.run([str(helm_binary), "template", RELEASE, str(ROOT / "charts" / "slotune"),
                               "--namespace", SYSTEM_NAMESPACE, *shown], check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


def service_account_kubeconfig(kube, account: str, path: Path, namespace: str = SYSTEM_NAMESPACE) -> Path:
    """The admin kubeconfig's cluster, with the ServiceAccount's token as the only credential."""
    token = kube.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(Path(kube.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    config = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
              "users": [{"name": account, "user": {"token": token}}],
              "contexts": [{"name": account, "context": {"cluster": cluster["name"], "user": account}}],
              "current-context": account}
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def rbac_kubeconfig(kube, helm_binary, tmp_path) -> Iterator[Path]:
    kube.kubectl("apply", "-f", str(ROOT / "crds" / "tunedmodel.yaml"))
    wait_for(lambda: kube.kubectl("wait", "--for=condition=Established", "crd/tunedmodels.slotune.io",
                                  "--timeout=10s", check=False).returncode == 0, 60, "the CRD")
    kube.kubectl("create", "namespace", SYSTEM_NAMESPACE)
    objects = render(helm_binary, "serviceaccount.yaml", "rbac.yaml")
    for manifest in objects:
        apply(kube, manifest)
    (account,) = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    yield service_account_kubeconfig(kube, account, tmp_path / "operator.kubeconfig")
    for manifest in objects:
        if manifest["kind"].startswith("ClusterRole"):
            kube.kubectl("delete", manifest["kind"].lower(), manifest["metadata"]["name"], check=False)
    kube.kubectl("delete", "namespace", SYSTEM_NAMESPACE, "--wait=false")


def test_operator_deploys_reports_and_cleans_up_with_the_charts_rbac(kube, rbac_kubeconfig, tmp_path) -> None:
    namespace = f"rbac-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(rbac_kubeconfig, tmp_path / "operator", {"SLOTUNE_PROMETHEUS_URL": ""})
    with operator:
        apply(kube, tunedmodel("least", namespace))  # tuning online: the loop's reads and status writes too
        ready = wait_for(lambda: (c := condition(get(kube, "tunedmodel", "least", namespace), "Ready"))
                         and c["status"] == "True", 90, "Ready=True", describe=operator.log_tail)
        assert ready
        assert get(kube, "secret", "least-admin-token", namespace) is not None
        assert "Deployed" in {e["reason"] for e in events(kube, namespace, "least")}
        kube.kubectl("delete", "tunedmodel", "least", "-n", namespace, "--timeout=60s")  # the finalizer needs patch
        wait_for(lambda: get(kube, "deployment", "least-runtime", namespace) is None, 60, "the Deployment gone")
        log = operator.log_tail(2000)
    kube.kubectl("delete", "namespace", namespace, "--wait=false")
    # An RBAC denial names the user (other tests' namespaces being deleted give unrelated 403s).
    assert f'User "system:serviceaccount:{SYSTEM_NAMESPACE}:' not in log, log
    assert "Handler 'created' succeeded" in log
