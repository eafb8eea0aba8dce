"""Fixtures the end-to-end tests share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def model_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny checkpoint builtin://tiny resolves to, built once up front where the runtimes look for it."""
    from gpu_runtime.checkpoint.builtin import build_checkpoint

    cache = tmp_path_factory.mktemp("models")
    build_checkpoint(cache / "tiny", preset="tiny")
    monkeypatch.setenv("SLOTUNE_MODEL_CACHE", str(cache))
    return cache


@pytest.fixture(scope="session")
def operator_kubeconfig(kube, helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the operator (process or in-test backend) acts as: the chart's ServiceAccount with exactly the chart's
    RBAC, so the e2e suite passes with nothing more than the chart grants."""
    from tests.e2e.harness.rbac import chart_rbac_kubeconfig

    return chart_rbac_kubeconfig(kube, helm_binary, tmp_path_factory.mktemp("rbac") / "operator.kubeconfig")
