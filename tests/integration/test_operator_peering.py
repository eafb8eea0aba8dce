"""Several operator replicas do not fight (kopf peering, as the chart installs it), and a ServiceMonitor is applied
only where the Prometheus Operator's CRD exists."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness.kube import apply, get, scratch_namespace, wait_for
from tests.e2e.harness.operator import OperatorProcess
from tests.integration.test_operator import tunedmodel

ROOT = Path(__file__).resolve().parents[2]
PEERING = f"slotune-test-{uuid.uuid4().hex[:6]}"
# The part of the Prometheus Operator's ServiceMonitor CRD the API server needs to serve the kind.
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def established(kube, crd: str) -> bool:
    return kube.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=10s",
                        check=False).returncode == 0


def is_active(log: str) -> bool:
    """Whether the replica's last peering decision was to work (a replica may resume, then pause for a peer)."""
    return log.rfind("Resuming operations") > log.rfind("Pausing operations")


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    kube.kubectl("apply", "-f", str(ROOT / "crds" / "tunedmodel.yaml"))
    kube.kubectl("apply", "-f", str(ROOT / "charts" / "slotune" / "crds" / "kopf-peering.yaml"))
    apply(kube, SERVICE_MONITOR_CRD)
    for crd in ("tunedmodels.slotune.io", "clusterkopfpeerings.kopf.dev", "servicemonitors.monitoring.coreos.com"):
        wait_for(lambda crd=crd: established(kube, crd), 60, crd)
    apply(kube, {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING}})
    with scratch_namespace(kube, "peer") as name:
        yield name


def test_two_replicas_elect_one_and_the_active_one_applies_a_service_monitor(kube, namespace, tmp_path) -> None:
    env = {"SLOTUNE_PEERING": PEERING, "SLOTUNE_PROMETHEUS_URL": ""}
    first = OperatorProcess(kube.kubeconfig, tmp_path / "first", env)
    second = OperatorProcess(kube.kubeconfig, tmp_path / "second", env)
    with first, second:
        def peers() -> dict:
            return (get(kube, "clusterkopfpeering", PEERING, "default") or {}).get("status") or {}

        wait_for(lambda: len(peers()) == 2, 60, "both replicas in the peering",
                 describe=lambda: first.log_tail() + second.log_tail())
        # Peered replicas start paused; only the highest-priority one resumes.
        wait_for(lambda: [p for p in (first, second) if is_active(p.log_tail())], 60,
                 "one replica to become active", describe=lambda: first.log_tail() + second.log_tail())
        apply(kube, tunedmodel("peered", namespace, tuning={"mode": "off", "windowSeconds": 5, "minSamples": 10}))
        monitor = wait_for(lambda: get(kube, "servicemonitor", "peered-runtime", namespace), 60, "the ServiceMonitor",
                           describe=lambda: first.log_tail() + second.log_tail())
        # The handler creates the ServiceMonitor before kopf logs its success: wait for the line before counting it.
        wait_for(lambda: "Handler 'created' succeeded" in first.log_tail(400) + second.log_tail(400), 30,
                 "the created handler to finish", describe=lambda: first.log_tail() + second.log_tail())
        active = [p for p in (first, second) if is_active(p.log_tail(400))]
        logs = first.log_tail(400) + second.log_tail(400)
    assert len(active) == 1  # exactly one works, the other stands by
    assert "Possibly conflicting operators" not in logs
    assert logs.count("Handler 'created' succeeded") == 1  # the TunedModel was handled once, by the active one
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == "http" and endpoint["relabelings"][0]["replacement"] == "peered-runtime"
    assert json.dumps(monitor["metadata"]["ownerReferences"]).count("peered") == 1
