"""Serving-layer overhead: tokens/s through the HTTP stream vs the engine alone, at 32 concurrent streams on CPU.

Both sides run the same tiny checkpoint, the same knobs and one torch thread; the engine-alone runs step an in-process
LLMEngine with 32 requests until they finish, the server runs send 32 concurrent streaming completions to a
`python -m gpu_runtime serve` process from this process. Runs alternate (engine, server, engine, server, ...) so
machine noise hits both sides alike (docs/facts.md#cpu: compare ratios measured in one run).

    .venv/bin/python bench/bench_server.py [--rounds 5] [--max-tokens 128] [--streams 32]

Writes bench/results/server.json and bench/results/server.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gpu_runtime.checkpoint.builtin import build_checkpoint
from gpu_runtime.config import EngineConfig, SamplingParams, SchedulerKnobs
from gpu_runtime.engine.llm_engine import LLMEngine
from slotune.backends.processes import LaunchSpec, RuntimeProcess

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = "Once upon a time there was a small model that wanted to write stories about rivers"


@dataclass(frozen=True)
class Run:
    side: str  # "engine" or "server"
    tokens: int
    wall_s: float
    cpu_s: float  # CPU time of the serving process (engine: this process; server: the server process)
    http_cpu_s: float = 0.0  # server only: CPU of every thread but the busiest one (the engine worker)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def cpu_us_per_token(self) -> float:
        return self.cpu_s / self.tokens * 1e6

    @property
    def http_cpu_us_per_token(self) -> float:
        return self.http_cpu_s / self.tokens * 1e6


def engine_run(engine: LLMEngine, streams: int, max_tokens: int, round_index: int) -> Run:
    prompt = engine.tokenizer.encode(PROMPT)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    for index in range(streams):
        engine.add_request(f"bench-{round_index}-{index}", prompt, params)
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(output.new_token_ids) for output in engine.step())
    return Run("engine", tokens, time.perf_counter() - start, time.process_time() - cpu_start)


def _cpu_s(stat_path: Path) -> float:
    fields = stat_path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime, proc(5)


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of a process, by thread id."""
    threads: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            threads[task.name] = _cpu_s(task / "stat")
        except OSError:  # the thread ended between listing and reading
            continue
    return threads


async def stream_one(port: int, body: bytes) -> int:
    """One streamed completion over a bare asyncio connection: the client stays cheap, so the server gets the CPU."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    tail = b""
    while b"data: [DONE]" not in tail:
        chunk = await reader.read(65536)
        if not chunk:
            raise ConnectionError("server closed the stream early")
        tail = (tail + chunk)[-600:]
    writer.close()
    usage_event = tail.split(b"data: ")[-2].split(b"\r\n")[0]  # the usage event precedes [DONE]
    return int(json.loads(usage_event)["usage"]["completion_tokens"])


async def server_run(port: int, pid: int, streams: int, max_tokens: int) -> Run:
    body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
    start, before = time.perf_counter(), thread_cpu_s(pid)
    counts = await asyncio.gather(*(stream_one(port, body) for _ in range(streams)))
    wall_s, after = time.perf_counter() - start, thread_cpu_s(pid)
    deltas = [after[tid] - before.get(tid, 0.0) for tid in after]
    total_s = sum(deltas)
    return Run("server", sum(counts), wall_s, total_s, http_cpu_s=total_s - max(deltas))


def start_server(model_dir: Path, streams: int, workdir: Path) -> RuntimeProcess:
    token_file = workdir / "admin-token"
    token_file.write_text("bench-server")
    spec = LaunchSpec(str(model_dir), "tiny", ("--max-num-seqs", str(streams)), token_file, workdir,
                      extra_args=("--dtype", "float32"))
    runtime = RuntimeProcess(spec, index=0)
    runtime.wait_healthy()
    return runtime


def machine() -> dict[str, object]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "?")
    return {"cpu_model": model, "cpu_cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "torch_threads": 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    workdir = Path(tempfile.mkdtemp(prefix="bench-server-"))
    model_dir = build_checkpoint(workdir / "tiny", "tiny")
    knobs = SchedulerKnobs(max_num_seqs=args.streams)
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", device="cpu", knobs=knobs))
    server = start_server(model_dir, args.streams, workdir)
    port = server.port
    try:
        engine_run(engine, args.streams, 8, -1)  # warm-up both sides
        asyncio.run(server_run(port, server.process.pid, args.streams, 8))
        runs: list[Run] = []
        for round_index in range(args.rounds):
            runs.append(engine_run(engine, args.streams, args.max_tokens, round_index))
            runs.append(asyncio.run(server_run(port, server.process.pid, args.streams, args.max_tokens)))
            print(f"round {round_index}: engine {runs[-2].tokens_per_s:.0f} tok/s "
                  f"{runs[-2].cpu_us_per_token:.0f} us CPU/token, server {runs[-1].tokens_per_s:.0f} tok/s "
                  f"{runs[-1].cpu_us_per_token:.0f} us CPU/token", flush=True)
    finally:
        server.stop(timeout_s=15)
    write_results(runs, args)
    return 0


def _median(runs: list[Run], side: str, value: str) -> float:
    return statistics.median(getattr(r, value) for r in runs if r.side == side)


def write_results(runs: list[Run], args: argparse.Namespace) -> None:
    engine_tps, server_tps = _median(runs, "engine", "tokens_per_s"), _median(runs, "server", "tokens_per_s")
    engine_cpu, server_cpu = _median(runs, "engine", "cpu_us_per_token"), _median(runs, "server", "cpu_us_per_token")
    http_cpu = _median(runs, "server", "http_cpu_us_per_token")
    result = {"benchmark": "server_overhead", "machine": machine(), "model": "tiny (checkpoint preset, fp32)",
              "streams": args.streams, "max_tokens": args.max_tokens, "rounds": args.rounds,
              "load_average_1m_at_end": os.getloadavg()[0],
              "engine_tokens_per_s_median": engine_tps, "server_tokens_per_s_median": server_tps,
              "throughput_overhead_fraction": 1 - server_tps / engine_tps,
              "engine_cpu_us_per_token_median": engine_cpu, "server_cpu_us_per_token_median": server_cpu,
              "cpu_overhead_fraction": server_cpu / engine_cpu - 1,
              "server_http_threads_cpu_us_per_token_median": http_cpu, "target_overhead_fraction": 0.15,
              "runs": [asdict(r) | {"tokens_per_s": r.tokens_per_s, "cpu_us_per_token": r.cpu_us_per_token}
                       for r in runs]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "server.json").write_text(json.dumps(result, indent=2) + "\n")
    m = result["machine"]
    lines = [
        "# Serving-layer overhead (bench/bench_server.py)", "",
        f"Machine: {m['cpu_model']}, {m['cpu_cores']} cores, torch {m['torch']}, 1 torch thread; "
        f"1-minute load average at the end: {result['load_average_1m_at_end']:.1f}.",
        f"Model: tiny checkpoint preset (fp32, CPU). {args.streams} concurrent streams, {args.max_tokens} tokens "
        f"each (ignore_eos), {args.rounds} alternating rounds per side; medians.", "",
        "| side | tokens/s | CPU us per token (serving process) |", "|---|---|---|",
        f"| engine alone (in process) | {engine_tps:.0f} | {engine_cpu:.0f} |",
        f"| through HTTP SSE streams | {server_tps:.0f} | {server_cpu:.0f} |", "",
        f"Throughput cost of the server: **{result['throughput_overhead_fraction'] * 100:.1f}%**; "
        f"CPU cost per token: **{result['cpu_overhead_fraction'] * 100:+.1f}%** (target < 15%).",
        f"Of the server's CPU per token, {http_cpu:.0f} us are spent outside the engine worker thread (event loop, "
        f"HTTP, SSE framing): {http_cpu / engine_cpu * 100:.1f}% of the engine's own cost; the engine worker "
        f"thread itself spends {server_cpu - http_cpu:.0f} us per token in the server vs {engine_cpu:.0f} us "
        "alone.", "",
        "Per run: " + ", ".join(f"{r.side} {r.tokens_per_s:.0f} tok/s {r.cpu_us_per_token:.0f} us" for r in runs), "",
        "The client (bare asyncio sockets, this process) shares the machine's cores with the server. When other",
        "work loads the machine, wall-clock throughput swings with the share of CPU each side gets; CPU time per",
        "token of the serving process is the steadier measure of what the HTTP layer costs.",
    ]
    (RESULTS / "server.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
