"""A Mooncake-format trace replayed against a real runtime (builtin `tiny` on CPU): the replay sends the same requests
every time, and requests whose hash ids agree share prompt text, so the runtime's prefix cache measures hits
(vllm:prefix_cache_hits over vllm:prefix_cache_queries, in tokens) that a trace without shared ids does not get.

Prompts are 700 tokens (one full 512-token block, then a request's own tail) within tiny's 1,024-token limit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from slotune.loadgen.prompts import load_trace
from slotune.loadgen.runner import RunPlan, run_workload
from slotune.traces import TraceReplay
from slotune.workload import WorkloadSpec
from tests.harness.runtime import RuntimeServer

NUM_REQUESTS = 16


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeServer]:
    workdir = tmp_path_factory.mktemp("trace-runtime")
    server = RuntimeServer("builtin://tiny", workdir, env={"SLOTUNE_MODEL_CACHE": str(workdir / "models")})
    try:
        yield server
    finally:
        server.stop()


def mooncake(path: Path, shared: bool) -> Path:
    """16 requests, 4 a second; with `shared` every prompt's first block is block 7, else each has its own."""
    rows = [{"timestamp": i * 250, "input_length": 700, "output_length": 4, "hash_ids": [7 if shared else 100 + i,
                                                                                           1000 + i]}
            for i in range(NUM_REQUESTS)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def replay(server: RuntimeServer, trace: Path) -> tuple[list[tuple[int, int]], float, float]:
    """Replay the trace once: each request's (index, served prompt tokens), and the prefix-cache hits and queries
    (tokens) the runtime counted meanwhile."""
    hits, queries = server.metric("vllm:prefix_cache_hits_total"), server.metric("vllm:prefix_cache_queries_total")
    requests = load_trace(trace, TraceReplay(trace, max_output_tokens=4))
    plan = RunPlan(urls=(server.url,), warmup_requests=0, show_progress=False, tokens_per_word=1.0)
    result = asyncio.run(run_workload(WorkloadSpec(), plan, requests))
    assert all(r.ok for r in result.records), [r.error for r in result.records if not r.ok]
    served = [(r.index, r.prompt_tokens) for r in result.records]
    return (served, server.metric("vllm:prefix_cache_hits_total") - hits,
            server.metric("vllm:prefix_cache_queries_total") - queries)


def test_replay_is_deterministic_and_shared_hash_ids_hit_the_prefix_cache(runtime: RuntimeServer,
                                                                          tmp_path: Path) -> None:
    unshared = mooncake(tmp_path / "unshared.jsonl", shared=False)
    _, hits_unshared, queries_unshared = replay(runtime, unshared)
    trace = mooncake(tmp_path / "shared.jsonl", shared=True)
    first, hits, queries = replay(runtime, trace)
    second, _, _ = replay(runtime, trace)
    assert len(first) == NUM_REQUESTS and first == second  # the same prompts, token for token counted, both times
    assert queries > 0 and queries_unshared > 0
    hit_rate, unshared_rate = hits / queries, hits_unshared / queries_unshared
    # 15 of 16 requests find the shared 512-token block cached: about 0.6 of their prompt tokens.
    assert hit_rate > 0.3, (hits, queries)
    assert hit_rate > unshared_rate + 0.2, (hit_rate, unshared_rate)
