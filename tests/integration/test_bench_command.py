"""`slotune bench` end to end: a real runtime process, the CLI as a subprocess, its JSON and PNG read back.

The runtime serves `builtin://tiny` on CPU (the checkpoint is generated into a temporary SLOTUNE_MODEL_CACHE).
One runtime admits freely; another runs one sequence and admits one waiting request, so a burst draws 429s,
which the summary must count as failed and rejected requests and as SLO violations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from tests.harness.runtime import RuntimeServer

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LATENCY_KEYS = ("ttft", "tpot", "itl", "e2el")
SMALL_REQUESTS = ["--prompt-tokens", "20", "60", "--max-prompt-tokens", "100", "--output-tokens", "6", "12"]


@pytest.fixture(scope="module")
def runtime_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """start(*flags) -> URL of a healthy runtime; every runtime started is stopped at module teardown."""
    workdir = tmp_path_factory.mktemp("bench-runtime")
    started: list[RuntimeServer] = []

    def start(*extra: str) -> str:
        server = RuntimeServer("builtin://tiny", workdir, extra, env={"SLOTUNE_MODEL_CACHE": str(workdir / "models")})
        started.append(server)
        return server.url

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def runtime(runtime_factory) -> str:
    return runtime_factory()


def _bench(url: str, out: Path, *flags: str) -> tuple[int, dict]:
    """Run `slotune bench` as a subprocess; (exit code, bench.json)."""
    completed = subprocess.run(
        [sys.executable, "-m", "slotune.cli", "bench", "--url", url, "--out", str(out), "--no-progress", *flags],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert completed.returncode in (0, 1), completed.stderr[-3000:]
    assert (out / "bench.json").exists(), completed.stdout[-2000:] + completed.stderr[-3000:]
    return completed.returncode, json.loads((out / "bench.json").read_text())


def test_bench_writes_vllm_style_json_with_cis_and_slo_fields(runtime: str, tmp_path: Path) -> None:
    code, result = _bench(runtime, tmp_path, "--num-requests", "30", "--rate", "15", "--arrival", "poisson",
                          *SMALL_REQUESTS, "--warmup-requests", "2", "--slo-ttft-p99-ms", "60000",
                          "--slo-e2e-p99-ms", "60000")
    assert code == 0 and result["completed"] == 30 and result["failed"] == 0 and result["rejected"] == 0
    for key in LATENCY_KEYS:
        for stat in ("mean", "median", "std", "p50", "p90", "p95", "p99"):
            assert isinstance(result[f"{stat}_{key}_ms"], float), (stat, key)
        for p in (50, 90, 95, 99):
            low, high = result[f"p{p}_{key}_ci_ms"]
            assert 0 < low <= result[f"p{p}_{key}_ms"] <= high, (p, key)
    assert result["slo_attainment"] == 1.0 and result["slo_met"] is True
    assert result["request_goodput"] == pytest.approx(30 / result["duration"])
    assert [(r["name"], r["met"]) for r in result["slo_results"]] == [("ttft_p99", True), ("e2e_p99", True)]
    assert result["model"] and result["workload"]["profile"] == "chat"
    png = tmp_path / "latency_cdf.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(png) as image:
        image.verify()
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[0] > image.size[1] > 100


def test_bench_replays_a_trace_at_its_lengths(runtime: str, tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1_700_000_000.0, "prompt_tokens": 30, "output_tokens": 5},
        {"timestamp": 1_700_000_000.2, "prompt": "the cat sat on the mat and looked at the dog", "output_tokens": 7},
        {"timestamp": 1_700_000_000.5, "prompt_tokens": 50, "output_tokens": 3},
        {"timestamp": 1_700_000_000.9, "prompt_tokens": 12, "output_tokens": 9},
        {"timestamp": 1_700_000_001.2, "prompt": "of and to in is that for it as was", "output_tokens": 4},
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    code, result = _bench(runtime, tmp_path / "out", "--trace", str(trace), "--warmup-requests", "1")
    assert code == 0 and result["completed"] == 5 and result["failed"] == 0
    # ignore_eos forces each output to its recorded length; the replay waits for the recorded arrival times.
    assert result["total_output_tokens"] == sum(row["output_tokens"] for row in rows)
    assert result["duration"] >= 1.2
    assert result["workload"] == {"trace": str(trace)}

    code, first_two = _bench(runtime, tmp_path / "cut", "--trace", str(trace), "--num-requests", "2",
                             "--warmup-requests", "0")
    assert code == 0 and first_two["completed"] == 2 and first_two["total_output_tokens"] == 5 + 7


def test_custom_lengths_hold_without_warm_up(runtime: str, tmp_path: Path) -> None:
    # Seen before: --profile custom refused before the length flags applied; --warmup-requests 0 sent the words
    # uncalibrated (asked 271 prompt tokens, served 443 on this tokenizer).
    code, result = _bench(runtime, tmp_path, "--profile", "custom", "--prompt-tokens", "271", "271",
                          "--output-tokens", "4", "4", "--num-requests", "6", "--rate", "20", "--warmup-requests", "0")
    assert code == 0 and result["completed"] == 6 and result["workload"]["profile"] == "custom"
    assert result["total_input_tokens"] / 6 == pytest.approx(271, rel=0.15)
    assert result["total_output_tokens"] == 6 * 4


def test_rejected_requests_are_failures_and_slo_violations(runtime_factory, tmp_path: Path) -> None:
    # One running and one waiting: a third request in flight is refused. Without the one-sequence limit the engine
    # admits a whole burst at its next step, and a loaded client that sends slower than that drew no 429 at all.
    # Each request decodes 64 tokens: with 6-12, the engine thread finished each before the server's starved event
    # loop read the next from its socket (24 completed in 0.22 s, none refused, on a box slowed by other work).
    url = runtime_factory("--max-num-seqs", "1", "--max-waiting-requests", "1")
    long_outputs = [*SMALL_REQUESTS[:-3], "--output-tokens", "64", "64"]
    code, result = _bench(url, tmp_path, "--num-requests", "24", "--rate", "10000", "--arrival", "constant",
                          *long_outputs, "--warmup-requests", "0", "--slo-ttft-p99-ms", "60000")
    assert result["rejected"] > 0, result
    assert result["failed"] >= result["rejected"] and result["completed"] + result["failed"] == 24
    assert result["slo_attainment"] <= result["completed"] / 24
    assert result["request_goodput"] * result["duration"] == pytest.approx(result["slo_attainment"] * 24)
    # Each rejection is an infinitely slow request in the percentile, so P99 over 24 fails with even one 429.
    assert result["slo_results"][0]["observed_ms"] == float("inf") and result["slo_met"] is False and code == 1
