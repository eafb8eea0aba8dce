"""`slotune operator` started by hand says why it would do nothing: with no kopf peering CRD it runs standalone and
says so; with the CRD but no peering object it names the object to create (kopf itself waits for it in silence)."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.e2e.harness.kube import apply, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.operator import OperatorProcess
from tests.integration.test_operator import tunedmodel

ROOT = Path(__file__).resolve().parents[2]
PEERING_CRDS = ROOT / "charts" / "slotune" / "crds" / "kopf-peering.yaml"


def has_peering_crd(kube) -> bool:
    return kube.kubectl("get", "crd", "clusterkopfpeerings.kopf.dev", check=False).returncode == 0


def test_missing_peering_is_explained(kube, tmp_path) -> None:
    install_tunedmodel_crd(kube)
    name = f"absent-{uuid.uuid4().hex[:6]}"
    env = {"SLOTUNE_PEERING": name, "SLOTUNE_PROMETHEUS_URL": ""}
    with scratch_namespace(kube, "start") as namespace:
        if not has_peering_crd(kube):  # a cluster where only crds/ was applied: standalone, and it serves
            with OperatorProcess(kube.kubeconfig, tmp_path / "standalone", env) as operator:
                apply(kube, tunedmodel("served", namespace, tuning={"mode": "off"}))
                wait_for(lambda: get(kube, "deployment", "served-runtime", namespace), 60, "the Deployment",
                         describe=operator.log_tail)
                log = operator.log_tail(4000)
            assert f"peering '{name}' is configured but the cluster has no kopf peering CRD" in log, log
            assert "running standalone" in log

        kube.kubectl("apply", "-f", str(PEERING_CRDS))
        wait_for(lambda: kube.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev",
                                      "--timeout=10s", check=False).returncode == 0, 60, "the peering CRD")
        with OperatorProcess(kube.kubeconfig, tmp_path / "waiting", env) as operator:
            message = f"peering '{name}' is configured but ClusterKopfPeering {name} does not exist"
            wait_for(lambda: message in operator.log_tail(4000), 60, "the warning", describe=operator.log_tail)
            assert "SLOTUNE_PEERING=''" in operator.log_tail(4000)
