"""Start serving: parsed flags -> EngineConfig -> LLMEngine -> app -> uvicorn on host:port."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
import uvicorn

from gpu_runtime.checkpoint.source import resolve_model
from gpu_runtime.config import EngineConfig, SchedulerKnobs
from gpu_runtime.engine.llm_engine import LLMEngine
from gpu_runtime.server.app import ServerSettings, build_app

log = logging.getLogger(__name__)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    knobs = SchedulerKnobs(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                           enable_chunked_prefill=args.enable_chunked_prefill,
                           enable_prefix_caching=args.enable_prefix_caching)
    # Speculation and quantization go into the config so the engine sets them up before sizing the KV cache.
    return EngineConfig(model=args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                        block_size=args.block_size, kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                        gpu_memory_utilization=args.gpu_memory_utilization, knobs=knobs, seed=args.seed,
                        speculative=args.speculative_config, quantization=args.quantization)


def serve(args: argparse.Namespace, admin_token: str | None) -> int:
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    if args.max_waiting_requests < 1:
        raise SystemExit("--max-waiting-requests must be >= 1")
    if args.kv_cache_dtype != "auto":
        raise SystemExit(f"--kv-cache-dtype {args.kv_cache_dtype} is not supported by this runtime build")
    try:
        # builtin:// and pkg:// become a checkpoint directory or GGUF file; everything below sees a real path.
        args = argparse.Namespace(**vars(args) | {"model": resolve_model(args.model)})
        engine = LLMEngine(engine_config(args))
    except (ValueError, OSError) as error:  # a bad model path or file: one line, not a traceback
        message = " ".join(str(error).split())
        raise SystemExit(f"cannot start the engine: {message}") from error
    settings = ServerSettings(
        served_model_name=args.served_model_name or Path(args.model).resolve().name,
        max_waiting_requests=args.max_waiting_requests, admin_token=admin_token, kv_cache_dtype=args.kv_cache_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization, extra_edges=args.slo_bucket_edges,
        admin_apart=args.admin_port is not None)
    app = build_app(engine, settings)
    if admin_token is None:
        log.warning("no admin token (--admin-token-file or SLOTUNE_ADMIN_TOKEN): /admin/config is disabled")
    main = uvicorn.Server(_config(app, args, args.port))
    if args.admin_port is None:
        main.run()
    else:
        asyncio.run(_serve_both(main, _AdminServer(_config(app.state.admin_app, args, args.admin_port))))
    return 0


def _config(app: object, args: argparse.Namespace, port: int) -> uvicorn.Config:
    return uvicorn.Config(app, host=args.host, port=port, log_level=args.log_level, access_log=False,
                          timeout_graceful_shutdown=5)


class _AdminServer(uvicorn.Server):
    """The admin port's server: the main server owns the signals and this one stops when it does."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve_both(main: uvicorn.Server, admin: uvicorn.Server) -> None:
    admin_task = asyncio.create_task(admin.serve())
    try:
        await main.serve()
    finally:
        admin.should_exit = True
        await admin_task
