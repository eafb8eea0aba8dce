"""Bad input the API server accepts but that cannot run, through one real `slotune operator`: every case of
tests/unit/tunedmodel_degraded_cases.yaml ends `Degraded` with the API server's (or the runtime policy's) message
naming the field, and the operator is still up afterwards, with no traceback in its log."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.harness.kube import apply, condition, install_tunedmodel_crd, items, scratch_namespace, wait_for_progress
from tests.e2e.harness.operator import OperatorProcess
from tests.unit.api_cases import degraded_cases

CASES = degraded_cases()


@pytest.fixture(scope="module")
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "bad") as name:
        yield name


@pytest.fixture(scope="module")
def operator(kube, namespace, tmp_path_factory) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kube.kubeconfig, tmp_path_factory.mktemp("operator"), {"SLOTUNE_PROMETHEUS_URL": ""})
    with process:
        yield process
    print(process.log_tail())


def degraded(obj: dict[str, Any]) -> dict[str, Any] | None:
    found = condition(obj, "Degraded")
    return found if found and found["status"] == "True" else None


@pytest.fixture(scope="module")
def outcomes(kube, namespace, operator) -> dict[str, dict[str, Any]]:
    """Apply every case at once, then wait while more of them reach Degraded (progress, not a clock)."""
    for case in CASES:
        apply(kube, case.manifest | {"metadata": {"name": case.name, "namespace": namespace}})

    def found() -> dict[str, dict[str, Any]]:
        return {tm["metadata"]["name"]: tm for tm in items(kube, "tunedmodel", namespace) if degraded(tm)}

    wait_for_progress(lambda: len(found()), len(CASES), 60, "TunedModels Degraded", describe=operator.log_tail)
    return found()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_unrunnable_spec_is_degraded_with_the_servers_message(outcomes, case) -> None:
    tm = outcomes[case.name]
    message = degraded(tm)["message"]
    assert case.path in message and case.message in message, json.dumps(tm["status"], indent=1)
    assert tm["status"]["phase"] == "Degraded"


def test_the_operator_survives_every_case(outcomes, operator) -> None:
    assert len(outcomes) == len(CASES) and operator.alive()
    log = operator.log_path.read_text(errors="replace")
    assert "Traceback" not in log, operator.log_tail(200)

