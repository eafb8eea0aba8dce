"""hack/kwok_cluster.py ownership: clusters are named and owned; `up` reaps only clusters whose owner died and
never touches one a live owner holds. No control plane runs here: a cluster's record is what these decisions read
(tests/integration/test_kwok_cluster.py starts real ones)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import kwok_cluster  # hack/ on sys.path (tests/conftest.py)
from kwok_cluster import Cluster, ClusterInUse, Owner


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def record(workdir: Path, name: str, owner: Owner) -> None:
    path = kwok_cluster.owners_dir(workdir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": owner.pid, "start_ticks": owner.start_ticks}))


def test_only_clusters_whose_owner_died_are_orphans(tmp_path: Path) -> None:
    me = Owner.this_process()
    record(tmp_path, "live", me)
    record(tmp_path, "persistent", Owner(None))
    record(tmp_path, "dead", Owner(dead_pid(), me.start_ticks))
    record(tmp_path, "reused-pid", Owner(os.getpid(), (me.start_ticks or 0) - 1))  # same pid, another process
    (kwok_cluster.owners_dir(tmp_path) / "garbled.json").write_text("{")
    assert me.alive() and Owner(None).alive()
    assert sorted(kwok_cluster.orphans(tmp_path)) == ["dead", "garbled", "reused-pid"]


def test_a_second_named_cluster_leaves_the_first_alone(tmp_path: Path) -> None:
    record(tmp_path, "first", Owner.this_process())
    second = Cluster("second", tmp_path, bin_dir=tmp_path / "no-binaries")
    assert second.reap_orphans() == []
    assert (kwok_cluster.owners_dir(tmp_path) / "first.json").exists()


def test_up_refuses_a_name_a_live_owner_holds_without_touching_it(tmp_path: Path) -> None:
    record(tmp_path, "taken", Owner.this_process())
    # No binaries: any attempt to create or delete a cluster would fail with FileNotFoundError instead.
    with pytest.raises(ClusterInUse, match=f"pid {os.getpid()}"):
        Cluster("taken", tmp_path, bin_dir=tmp_path / "no-binaries").up()
    assert kwok_cluster.read_owners(tmp_path) == {"taken": Owner.this_process()}


def test_a_dead_owners_record_is_reaped(tmp_path: Path) -> None:
    record(tmp_path, "killed-session", Owner(dead_pid(), 1))
    record(tmp_path, "live", Owner.this_process())
    assert Cluster("next", tmp_path, bin_dir=tmp_path / "no-binaries").reap_orphans() == ["killed-session"]
    assert list(kwok_cluster.read_owners(tmp_path)) == ["live"]


def test_a_persistent_cluster_that_stopped_is_recreated_not_refused(tmp_path: Path) -> None:
    # make cluster after a reboot: the record says persistent, nothing serves. up clears it and goes on to create,
    # which needs the binaries this test does not have.
    record(tmp_path, "slotune", Owner(None))
    with pytest.raises(FileNotFoundError):
        Cluster("slotune", tmp_path, bin_dir=tmp_path / "no-binaries").up(Owner(None))


def test_a_test_session_never_takes_over_a_persistent_cluster(tmp_path: Path) -> None:
    record(tmp_path, "slotune", Owner(None))
    with pytest.raises(ClusterInUse, match="persistent"):
        Cluster("slotune", tmp_path, bin_dir=tmp_path / "no-binaries").up()
