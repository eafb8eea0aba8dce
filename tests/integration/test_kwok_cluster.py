"""hack/kwok_cluster.py with real control planes: named clusters coexist, a live owner's cluster is never torn
down, and the next `up` reaps a cluster whose owner was killed (SIGKILL: no teardown ran)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import kwok_cluster  # hack/ on sys.path (tests/conftest.py)
from kwok_cluster import Cluster, ClusterInUse, Owner


def processes_of(cluster: Cluster) -> list[int]:
    """Live processes (etcd, kube-apiserver, ...) running from this cluster's folder."""
    marker = str(cluster.workdir / "clusters" / cluster.name)
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if entry.name.isdigit() and cmdline.startswith(marker) and kwok_cluster._start_ticks(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[list[Cluster]]:
    """Clusters in a workdir of their own; every one made is torn down afterwards."""
    made: list[Cluster] = []
    yield made
    for cluster in made:
        cluster.down()


def test_named_clusters_coexist_and_a_killed_owners_cluster_is_reaped(tmp_path: Path, clusters: list) -> None:
    binaries = kwok_cluster.binaries()
    owner = subprocess.Popen(["sleep", "3600"])  # stands in for a test session
    try:
        first, second, third = (Cluster(name, tmp_path, binaries) for name in ("first", "second", "third"))
        clusters += [first, second, third]
        first.up(Owner(owner.pid, kwok_cluster._start_ticks(owner.pid)))
        second.up()
        assert first._serving() and second._serving(), "the second cluster must leave the first running"
        with pytest.raises(ClusterInUse):
            Cluster("first", tmp_path, binaries).up()
        assert first._serving()
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert processes_of(first), "a killed owner leaves its control plane running"
        third.up()
        assert processes_of(first) == [] and not first.exists()
        assert second._serving() and third._serving()
    finally:
        owner.kill()
        owner.wait()
