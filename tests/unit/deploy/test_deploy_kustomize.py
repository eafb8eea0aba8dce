"""The kustomize base renders the same objects as the chart's default render (release `slotune`, namespace
slotune-system, CRDs included). Only the labels that name the tool differ and are ignored: helm.sh/chart and
app.kubernetes.io/managed-by (Helm vs kustomize)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

import kwok_cluster

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "slotune"
BASE = ROOT / "deploy" / "kustomize" / "base"
TOOL_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")

Key = tuple[str, str, str, str]


def kubectl_path() -> str:
    return str(kwok_cluster.tools_dir() / "kubectl")


def by_key(manifests: str) -> dict[Key, dict]:
    objects = {}
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        meta = doc["metadata"]
        key = (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in objects, f"duplicate {key}"
        for label in TOOL_LABELS:
            meta.get("labels", {}).pop(label, None)
        objects[key] = doc
    return objects


def chart_objects(helm_binary: Path) -> dict[Key, dict]:
    out = subprocess.run([str(helm_binary), "template", "slotune", str(CHART), "--namespace", "slotune-system",
                          "--include-crds"], check=True, capture_output=True, text=True).stdout
    return by_key(out)


def kustomize_objects() -> dict[Key, dict]:
    out = subprocess.run([kubectl_path(), "kustomize", str(BASE)], check=True, capture_output=True, text=True).stdout
    return by_key(out)


def test_kustomize_base_renders_the_same_objects_as_the_chart(helm_binary: Path) -> None:
    chart, kustomize = chart_objects(helm_binary), kustomize_objects()
    assert sorted(kustomize) == sorted(chart)
    for key, expected in chart.items():
        assert kustomize[key] == expected, f"{key} differs"


def test_the_tool_labels_are_the_only_difference(helm_binary: Path) -> None:
    out = subprocess.run([kubectl_path(), "kustomize", str(BASE)], check=True, capture_output=True, text=True).stdout
    deployment = next(d for d in yaml.safe_load_all(out) if d["kind"] == "Deployment")
    assert deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kustomize"
    assert chart_objects(helm_binary)[("apps/v1", "Deployment", "slotune-system", "slotune-operator")] != deployment
