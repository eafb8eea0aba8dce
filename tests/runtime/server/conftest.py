"""Real `python -m gpu_runtime serve` processes on loopback ports, serving a tiny checkpoint built by the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpu_runtime.checkpoint.builtin import build_checkpoint
from tests.harness.runtime import RuntimeServer

MODEL_NAME = "tiny"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny")


@pytest.fixture(scope="session")
def start_server(
    tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., RuntimeServer]]:
    """Factory: start_server(*flags) -> a healthy RuntimeServer, stopped at the end of the session."""
    started: list[RuntimeServer] = []

    def start(*flags: str) -> RuntimeServer:
        server = RuntimeServer(tiny_checkpoint, tmp_path_factory.mktemp("server"), flags)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def server(start_server: Callable[..., RuntimeServer]) -> RuntimeServer:
    """The shared server with default knobs (tests that change knobs start their own)."""
    return start_server("--max-num-seqs", "32")
