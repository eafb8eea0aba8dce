"""The HTTP application: wires the engine, metrics, OpenAI endpoints, admin endpoint and error handling together.

Every error leaves as an OpenAI-style object (`{"error": {"message", "type", "code"}}`): request validation failures
and malformed JSON as 400 (as vLLM answers them), unknown routes as 404, overload as 429 with Retry-After. A 5xx means
a bug or a dead engine, never bad input.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from gpu_runtime.server.admin import AdminState, build_admin_router
from gpu_runtime.server.async_engine import AsyncEngine
from gpu_runtime.server.chat import ChatTemplate
from gpu_runtime.server.metrics import ConfigInfo, ExtraEdges, RuntimeMetrics
from gpu_runtime.server.openai_api import OpenAIHandlers, ServedModel, build_openai_router
from gpu_runtime.server.protocol import APIError, ErrorBody, ErrorResponse

if TYPE_CHECKING:
    from gpu_runtime.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    """What the HTTP layer needs besides the engine (from the command line)."""

    served_model_name: str
    max_waiting_requests: int = 1024
    admin_token: str | None = None
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    extra_edges: ExtraEdges | None = None  # histogram edges at the SLO targets (--slo-bucket-edges)
    admin_apart: bool = False  # /admin/config on an app of its own (--admin-port), not beside the API


def build_app(engine: LLMEngine, settings: ServerSettings) -> FastAPI:
    """An app serving `engine` (an LLMEngine); its worker thread runs for the app's lifespan."""
    max_model_len = engine.max_model_len
    metrics = RuntimeMetrics(settings.served_model_name, max_model_len, settings.extra_edges)
    admin_state = AdminState(settings.admin_token)

    def publish_config(llm: LLMEngine) -> None:
        metrics.set_config(config_info(llm, settings))

    async_engine = AsyncEngine(engine, metrics, settings.max_waiting_requests, on_reconfigured=publish_config)
    publish_config(engine)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        try:
            yield
        finally:
            async_engine.shutdown()

    app = FastAPI(title="gpu_runtime", lifespan=lifespan)
    app.state.async_engine = async_engine
    model = ServedModel(settings.served_model_name, max_model_len, engine.model_config.vocab_size,
                        ChatTemplate.from_model(Path(engine.config.model)))
    app.include_router(build_openai_router(OpenAIHandlers(async_engine, model)))
    _add_probes(app, async_engine, metrics)
    _add_error_handlers(app)
    admin = FastAPI(title="gpu_runtime admin") if settings.admin_apart else app
    admin.include_router(build_admin_router(async_engine, admin_state))
    if admin is not app:
        _add_error_handlers(admin)
        app.state.admin_app = admin  # served on its own port by run.serve, so a NetworkPolicy can fence it alone
    return app


def config_info(engine: LLMEngine, settings: ServerSettings) -> ConfigInfo:
    knobs, stats = engine.knobs, engine.stats()
    speculative = "none" if engine.speculative is None else engine.speculative.to_vllm_json()
    return ConfigInfo(
        block_size=engine.config.block_size, cache_dtype=settings.kv_cache_dtype, num_gpu_blocks=stats.num_total_blocks,
        gpu_memory_utilization=settings.gpu_memory_utilization, max_model_len=engine.max_model_len,
        max_num_seqs=knobs.max_num_seqs, max_num_batched_tokens=knobs.max_num_batched_tokens,
        enable_chunked_prefill=knobs.enable_chunked_prefill, enable_prefix_caching=knobs.enable_prefix_caching,
        speculative_config=speculative, quantization=engine.quantization)


def _add_probes(app: FastAPI, engine: AsyncEngine, metrics: RuntimeMetrics) -> None:
    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.alive else 503)

    @app.get("/metrics")
    async def render_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


def _error(status: int, message: str, type_: str, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(message=message, type=type_, code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> JSONResponse:
        headers = None if error.retry_after_s is None else {"Retry-After": str(error.retry_after_s)}
        return _error(error.status, error.message, error.type, error.code, headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
        details = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:5])
        return _error(400, f"invalid request: {details}", "invalid_request_error", "invalid_request")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        return _error(error.status_code, str(error.detail), "invalid_request_error", None, error.headers)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _error(500, f"internal error: {type(error).__name__}", "server_error", "internal_error")
