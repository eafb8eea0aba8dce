"""An operator that cannot serve says why, in its log and on its liveness endpoint: the TunedModel CRD missing, RBAC
that forbids listing TunedModels, the configured peering object missing. Each runs a real `slotune operator` against
the real API server and fetches the endpoint."""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import kwok_cluster
from tests.e2e.harness.kube import install_tunedmodel_crd, wait_for
from tests.e2e.harness.operator import OperatorProcess
from tests.harness.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
CRD = "tunedmodels.slotune.io"


def serving(url: str) -> dict[str, Any] | None:
    """The `serving` probe's answer, None while the endpoint does not answer yet."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())["serving"]
    except OSError:
        return None


def liveness(process: OperatorProcess, url: str, expected: str) -> dict[str, Any]:
    """Fetch until the probe names `expected` (kopf caches probe results for 10 s)."""
    found = wait_for(lambda: (s := serving(url)) and any(expected in p for p in s["problems"]) and s, 60,
                     f"liveness naming {expected!r}", describe=lambda: f"{serving(url)}\n{process.log_tail()}")
    assert found["serving"] is False and process.alive()
    assert f"cannot serve: {found['problems'][0]}" in process.log_path.read_text()
    return found


def operator(kubeconfig: Path, workdir: Path, url: str, **env: str) -> OperatorProcess:
    return OperatorProcess(kubeconfig, workdir, {"SLOTUNE_PROMETHEUS_URL": "", "SLOTUNE_LIVENESS_ENDPOINT": url} | env)


@pytest.fixture
def url() -> str:
    return f"http://127.0.0.1:{free_port()}/healthz"


@pytest.fixture
def crd(kube) -> None:
    install_tunedmodel_crd(kube)


def test_missing_peering_object_is_named(kube, crd, tmp_path, url) -> None:
    kube.kubectl("apply", "-f", str(ROOT / "charts" / "slotune" / "crds" / "kopf-peering.yaml"))
    wait_for(lambda: kube.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev",
                                  "--timeout=10s", check=False).returncode == 0, 60, "the peering CRD")
    peering = f"absent-{uuid.uuid4().hex[:6]}"
    with operator(kube.kubeconfig, tmp_path, url, SLOTUNE_PEERING=peering) as process:
        liveness(process, url, f"ClusterKopfPeering {peering} does not exist")


@pytest.fixture
def unprivileged_kubeconfig(kube, crd, tmp_path) -> Iterator[Path]:
    """A ServiceAccount bound to nothing: it may discover APIs but list no TunedModels."""
    namespace = f"norbac-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", namespace)
    kube.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    token = kube.kubectl("create", "token", "nobody", "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(Path(kube.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    path = tmp_path / "nobody.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster], "users": [{"name": "nobody",
                                                                                "user": {"token": token}}],
        "contexts": [{"name": "nobody", "context": {"cluster": cluster["name"], "user": "nobody"}}],
        "current-context": "nobody"}))
    yield path
    kube.kubectl("delete", "namespace", namespace, "--wait=false")


def test_rbac_that_forbids_listing_tunedmodels_is_named(unprivileged_kubeconfig, tmp_path, url) -> None:
    with operator(unprivileged_kubeconfig, tmp_path, url, SLOTUNE_PEERING="") as process:
        found = liveness(process, url, "cannot list TunedModels in all namespaces (403)")
        assert "forbidden" in found["problems"][0]


@pytest.fixture
def bare_cluster() -> Iterator[kwok_cluster.Cluster]:
    """A control plane of this test's own, where the TunedModel CRD was never installed. (Deleting the session's
    CRD instead deletes every other test's TunedModels, and hangs on the finalizers of those whose operator is gone:
    under load it timed out and left the CRD terminating for every test after it.)"""
    cluster = kwok_cluster.Cluster(f"slotune-bare-{os.getpid()}", kwok_cluster.DEFAULT_WORKDIR,
                                   kwok_cluster.binaries())
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


def test_missing_crd_is_named(bare_cluster, tmp_path, url) -> None:
    with operator(bare_cluster.kubeconfig, tmp_path, url, SLOTUNE_PEERING="") as process:
        liveness(process, url, f"the TunedModel CRD ({CRD}) is not installed")


def test_a_serving_operator_says_so(kube, crd, tmp_path, url) -> None:
    with operator(kube.kubeconfig, tmp_path, url, SLOTUNE_PEERING="") as process:
        found = wait_for(lambda: serving(url), 60, "the liveness endpoint", describe=process.log_tail)
        assert found == {"serving": True, "problems": []}
