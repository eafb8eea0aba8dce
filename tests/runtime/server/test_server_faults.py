"""A dying engine: in-flight requests get an error, /health turns 503, new requests are refused, nothing hangs.

A real engine cannot be made to fail a step on demand, so this test (alone) replaces `step` with one that raises,
on a real nano engine served in process through the real app.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from gpu_runtime.checkpoint.builtin import build_checkpoint
from gpu_runtime.config import EngineConfig
from gpu_runtime.engine.llm_engine import LLMEngine
from gpu_runtime.server.app import ServerSettings, build_app


@pytest.fixture(scope="module")
def nano_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "nano", "nano")


def test_engine_failure_fails_requests_and_health(nano_checkpoint: Path) -> None:
    asyncio.run(_engine_failure(nano_checkpoint))


async def _engine_failure(model_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(model_dir), device="cpu", dtype="float32"))
    app = build_app(engine, ServerSettings(served_model_name="nano"))
    async_engine = app.state.async_engine
    async_engine.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            body = {"model": "nano", "prompt": "hello", "max_tokens": 4}
            assert (await http.get("/health")).status_code == 200
            assert (await http.post("/v1/completions", json=body)).status_code == 200

            def broken_step() -> list:
                raise RuntimeError("injected fault: the device went away")

            engine.step = broken_step
            failed = await http.post("/v1/completions", json=body)
            assert failed.status_code == 500 and "engine worker died" in failed.json()["error"]["message"]
            assert (await http.get("/health")).status_code == 503
            refused = await http.post("/v1/completions", json=body | {"stream": True})
            assert refused.status_code == 503 and json.loads(refused.text)["error"]["message"]
    finally:
        async_engine.shutdown()
