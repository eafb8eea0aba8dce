"""The chart ships the generated CRDs byte for byte, plus the kopf peering CRDs kopf itself looks for."""

from __future__ import annotations

from pathlib import Path

import yaml
from kopf._cogs.structs import references

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ROOT / "crds"
COPIES = (ROOT / "charts" / "slotune" / "crds", ROOT / "deploy" / "kustomize" / "base" / "crds")
PEERING = "kopf-peering.yaml"


def test_every_generated_crd_is_copied_byte_for_byte() -> None:
    generated = sorted(p.name for p in GENERATED.glob("*.yaml"))
    assert "tunedmodel.yaml" in generated
    for copies in COPIES:
        assert sorted(p.name for p in copies.iterdir()) == sorted([*generated, PEERING]), copies
        for name in generated:
            assert (copies / name).read_bytes() == (GENERATED / name).read_bytes(), (
                f"{copies / name} differs from crds/{name}: run `slotune crd --write` and copy crds/*.yaml")


def test_peering_copies_are_identical() -> None:
    first, second = (c / PEERING for c in COPIES)
    assert first.read_bytes() == second.read_bytes()


def test_peering_crds_serve_what_kopf_watches() -> None:
    crds = list(yaml.safe_load_all((COPIES[0] / PEERING).read_text()))
    served = {(c["spec"]["group"], v["name"], c["spec"]["names"]["plural"], c["spec"]["scope"])
              for c in crds for v in c["spec"]["versions"] if v["served"]}
    # kopf's own selectors for the kopf.dev peering resources (cluster-wide and per namespace).
    cluster, namespaced = references.CLUSTER_PEERINGS_K, references.NAMESPACED_PEERINGS_K
    assert served == {
        (cluster.group, cluster.version, cluster.any_name, "Cluster"),
        (namespaced.group, namespaced.version, namespaced.any_name, "Namespaced"),
    }
    for crd in crds:
        # kopf writes each replica's identity, priority and heartbeat under status; it must not be pruned.
        status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True
