"""The operator's identity in the end-to-end tests: the chart's ServiceAccount with exactly the chart's RBAC (rendered
by helm, cluster-wide), so every e2e run is also a test that the chart grants what the operator's code paths use. The
tests' own reads and the kubelet stand-in keep the admin kubeconfig."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.harness.kube import apply

ROOT = Path(__file__).resolve().parents[3]
RELEASE = "e2e-operator"
NAMESPACE = "slotune-e2e-operator"


def render(helm_binary: Path, namespace: str, release: str, *values: str) -> list[dict[str, Any]]:
    """The chart's ServiceAccount and RBAC objects, as helm renders them."""
    shown = [a for t in ("serviceaccount.yaml", "rbac.yaml") for a in ("--show-only", f"templates/{t}")]
    out = subprocess.run([str(helm_binary), "template", release, str(ROOT / "charts" / "slotune"), "--namespace",
                          namespace, *values, *shown], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def service_account_kubeconfig(kube: Any, account: str, namespace: str, path: Path) -> Path:
    """The admin kubeconfig's cluster, with the ServiceAccount's token as the only credential."""
    token = kube.kubectl("create", "token", account, "-n", namespace, "--duration=6h").stdout.strip()
    admin = yaml.safe_load(Path(kube.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    config = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
              "users": [{"name": account, "user": {"token": token}}],
              "contexts": [{"name": account, "context": {"cluster": cluster["name"], "user": account}}],
              "current-context": account}
    path.write_text(yaml.safe_dump(config))
    return path


def chart_rbac_kubeconfig(kube: Any, helm_binary: Path, path: Path) -> Path:
    """Install the chart's ServiceAccount and cluster-wide RBAC (idempotent) and return a kubeconfig acting as it."""
    kube.kubectl("create", "namespace", NAMESPACE, check=False)
    objects = render(helm_binary, NAMESPACE, RELEASE)
    for manifest in objects:
        apply(kube, manifest)
    (account,) = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    return service_account_kubeconfig(kube, account, NAMESPACE, path)
