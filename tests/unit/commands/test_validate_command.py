"""`slotune validate` refuses what the API server refuses, including numbers JSON cannot carry."""

from __future__ import annotations

import pytest

from slotune.cli import main

MANIFEST = """apiVersion: slotune.io/v1alpha1
kind: TunedModel
metadata: {{name: a}}
spec:
  model: {{name: m, source: hf://o/m}}
  hardware: {{accelerator: cpu, count: 0}}
  slo: {{ttft: {{p99: {ttft}}}}}
  {extra}
"""


@pytest.mark.parametrize(("value", "path", "extra"), [
    (".inf", "spec.slo.ttft.p99: .inf", ""),
    ("500", "spec.workload.requestRatePerSecond: .nan", "workload: {requestRatePerSecond: .nan}"),
    ("-.inf", "spec.slo.ttft.p99: -.inf", ""),
])
def test_non_finite_numbers_are_refused_by_path(tmp_path, capsys, value: str, path: str, extra: str) -> None:
    manifest = tmp_path / "tm.yaml"
    manifest.write_text(MANIFEST.format(ttft=value, extra=extra))
    assert main(["validate", str(manifest)]) == 1
    assert f"error: {path} is not a finite number" in capsys.readouterr().err


def test_finite_numbers_still_validate(tmp_path) -> None:
    manifest = tmp_path / "tm.yaml"
    manifest.write_text(MANIFEST.format(ttft="1e3", extra=""))
    assert main(["validate", "-o", "none", str(manifest)]) == 0
