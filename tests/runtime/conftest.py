"""Fixtures for the runtime tests: tiny deterministic checkpoints built once per session (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpu_runtime.checkpoint.builtin import build_checkpoint


@pytest.fixture(scope="session", autouse=True)
def _few_threads() -> None:
    # The test box has two cores shared with other suites; one thread avoids oversubscription stalls.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def nano_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("nano_llama"), preset="nano", arch="llama")


@pytest.fixture(scope="session")
def tiny_llama_sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("tiny_llama"), preset="tiny", arch="llama", num_shards=3)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("tiny_qwen2"), preset="tiny", arch="qwen2")
