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
