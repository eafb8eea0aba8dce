"""Aggregate tokens/s of N concurrent requests through an OpenAI-compatible HTTP server: the runtime's own
(`python -m gpu_runtime serve`, a real subprocess started by slotune's RuntimeProcess) and, when installed,
llama.cpp's `llama-server` with N slots.

Each request is a distinct prompt (no shared prefix to cache) asking for `max_tokens` tokens with ignore_eos, sent
all at once; aggregate tokens/s = completion tokens of all requests / wall time from the first send to the last
answer (prefill included, as a client sees it). Rounds alternate the servers so load hits both alike.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench import llama_cpp_peer
from slotune.backends.processes import LaunchSpec, RuntimeProcess

_PROMPT = "Request {i}: write a short note about the city number {i} on a long journey across the country."


@contextmanager
def runtime_server(path: str, threads: int, max_seqs: int) -> Iterator[str]:
    """The runtime as slotune runs it (slotune.backends.processes: own session, log file, killed at exit)."""
    with tempfile.TemporaryDirectory(prefix="real-model-streams-") as workdir:
        token_file = Path(workdir) / "admin-token"
        token_file.write_text("bench-real-model")
        spec = LaunchSpec(path, "smollm2", ("--dtype", "float32", "--max-num-seqs", str(max_seqs),
                                            "--max-num-batched-tokens", "2048", "--max-model-len", "1024"),
                          token_file, Path(workdir), num_threads=threads)
        runtime = RuntimeProcess(spec, index=0)
        try:
            runtime.wait_healthy(timeout_s=600)  # loading the GGUF takes minutes on a busy 2-core machine
            yield runtime.url
        finally:
            runtime.stop(timeout_s=30)


async def _streams(url: str, n: int, max_tokens: int) -> tuple[int, float]:
    async with httpx.AsyncClient(timeout=900) as client:
        async def one(i: int) -> int:
            body = {"model": "smollm2", "prompt": _PROMPT.format(i=i), "max_tokens": max_tokens,
                    "temperature": 0.0, "ignore_eos": True}
            answer = await client.post(f"{url}/v1/completions", json=body)
            answer.raise_for_status()
            return int(answer.json()["usage"]["completion_tokens"])

        start = time.perf_counter()
        tokens = await asyncio.gather(*(one(i) for i in range(n)))
        return sum(tokens), time.perf_counter() - start


def aggregate_tokens_per_s(url: str, n: int, max_tokens: int) -> float:
    tokens, wall = asyncio.run(_streams(url, n, max_tokens))
    if tokens != n * max_tokens:
        raise RuntimeError(f"{n} streams returned {tokens} tokens, expected {n * max_tokens}")
    return tokens / wall


def stream_throughput(path: str, peer: llama_cpp_peer.LlamaCpp | None, threads: int, streams: tuple[int, ...],
                      max_tokens: int, rounds: int) -> dict[str, Any]:
    """{"runtime": {N: tokens/s}, "llama_cpp": {N: tokens/s} or None}, medians over rounds."""
    top = max(streams)
    ours: dict[int, list[float]] = {n: [] for n in streams}
    theirs: dict[int, list[float]] = {n: [] for n in streams}
    with runtime_server(path, threads, top) as url:
        aggregate_tokens_per_s(url, 2, 4)  # warm-up
        peer_server = _peer(peer, path, threads, top)
        with peer_server as peer_url:
            for _ in range(rounds):
                for n in streams:
                    ours[n].append(aggregate_tokens_per_s(url, n, max_tokens))
                    if peer_url:
                        theirs[n].append(aggregate_tokens_per_s(peer_url, n, max_tokens))

    def medians(values: dict[int, list[float]]) -> dict[str, float]:
        return {str(n): round(sorted(v)[len(v) // 2], 1) for n, v in values.items() if v}

    return {"runtime_tokens_per_s": medians(ours), "llama_cpp_tokens_per_s": medians(theirs) or None,
            "max_tokens": max_tokens, "rounds": rounds}


@contextmanager
def _peer(peer: llama_cpp_peer.LlamaCpp | None, path: str, threads: int, slots: int) -> Iterator[str | None]:
    if peer is None:
        yield None
        return

    with llama_cpp_peer.server(peer, peer.f32(Path(path)), threads, slots=slots, context=256) as url:
        yield url
