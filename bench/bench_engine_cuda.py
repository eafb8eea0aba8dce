"""Engine decode on a CUDA device against the HBM bound: the "small" builtin checkpoint (~100M parameters, bf16) at
batch 1, 8 and 32, each decode step's time against the time its bytes take at the device's measured copy bandwidth
(weights except the embedding table, plus the KV cache read). Run by hack/gpu-check.sh where a GPU is lent; CI never
runs it.

The runtime has no CUDA graphs yet: each step launches its kernels from Python, so at batch 1 the step time is
launch overhead more than bandwidth; the result says so (`cuda_graphs`: "not implemented") rather than inventing an
"on" row. Medians of alternating rounds; the device and its bandwidth are recorded with the numbers.

    python -m bench.bench_engine_cuda [--rounds 3] [--max-tokens 64]

Writes bench/results/engine_cuda.json and bench/results/engine_cuda.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

from bench.bench_engine import CONCURRENCY, PROMPT_TOKENS, engine_decode
from gpu_runtime.checkpoint.builtin import build_checkpoint
from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SchedulerKnobs

RESULTS = Path(__file__).resolve().parent / "results"


def copy_bytes_per_s(nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (the bound's denominator)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return nbytes * repeats / (start.elapsed_time(end) / 1e3)


def step_bytes(engine: LLMEngine, n: int, context_tokens: int) -> int:
    cfg = engine.model_config
    itemsize = engine.dtype.itemsize
    weights = (cfg.num_params - cfg.vocab_size * cfg.hidden_size) * itemsize
    return weights + n * context_tokens * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize


def run(rounds: int, max_tokens: int) -> dict[str, object]:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "slotune" / "checkpoints"
    path = build_checkpoint(cache / "small-llama-bf16", preset="small", dtype="bfloat16")
    engine = LLMEngine(EngineConfig(model=str(path), dtype="bfloat16", device="cuda", gpu_memory_utilization=0.5,
                                    knobs=SchedulerKnobs(enable_prefix_caching=False)))
    engine_decode(engine, 2, 4)  # warm-up: allocations and kernel selection
    bandwidth = copy_bytes_per_s()
    steps: dict[int, list[float]] = {n: [] for n in CONCURRENCY}
    for _ in range(rounds):
        for n in CONCURRENCY:
            steps[n].append(engine_decode(engine, n, max_tokens).step_ms)
    context = PROMPT_TOKENS + max_tokens // 2
    rows = []
    for n in CONCURRENCY:
        ms = statistics.median(steps[n])
        bound_ms = step_bytes(engine, n, context) / (bandwidth / 2) * 1e3  # a step reads its bytes once
        rows.append({"concurrency": n, "step_ms": round(ms, 3), "tokens_per_s": round(n / ms * 1e3, 1),
                     "hbm_bound_ms": round(bound_ms, 3), "fraction_of_bound": round(bound_ms / ms, 3),
                     "rounds_ms": [round(v, 3) for v in steps[n]]})
    return {"benchmark": "engine_cuda", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "copy_bytes_per_s": round(bandwidth), "model": "builtin small (bf16)", "rounds": rounds,
            "max_tokens": max_tokens, "cuda_graphs": "not implemented in the runtime", "rows": rows}


def markdown(r: dict[str, object]) -> str:
    lines = ["# Engine decode on CUDA (bench/bench_engine_cuda.py)", "",
             f"Device: {r['device']}, torch {r['torch']}; copy bandwidth {int(r['copy_bytes_per_s']) / 1e9:.0f} GB/s "
             f"(read + written); model {r['model']}; {r['rounds']} rounds, {r['max_tokens']} new tokens; CUDA graphs: "
             f"{r['cuda_graphs']}.", "", "| concurrency | step ms | tokens/s | HBM bound ms | of the bound |",
             "|---|---|---|---|---|"]
    for row in r["rows"]:  # type: ignore[attr-defined]
        lines.append(f"| {row['concurrency']} | {row['step_ms']:.2f} | {row['tokens_per_s']:.0f} | "
                     f"{row['hbm_bound_ms']:.3f} | {row['fraction_of_bound']:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark runs only where a GPU is lent (hack/gpu-check.sh)")
    result = run(args.rounds, args.max_tokens)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "engine_cuda.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "engine_cuda.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
