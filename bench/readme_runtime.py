"""The README's rows for the runtime: the engine, the HTTP server, speculation, int8, and SmolLM2 against its
peers on the same weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.readme_format import Result, block, load, pct, row, times


def engine_rows(engine: Result) -> list[str]:
    rows = sorted(engine["engine"], key=lambda r: r["concurrency"])
    top, model = rows[-1], engine["model"]
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(model["dtype"], model["dtype"])
    targets = engine["targets"]
    return [
        row(f"engine, `{model['preset']}` ({model['params'] / 1e6:.0f}M, {dtype}) decode tokens/s, "
             f"{top['concurrency']} concurrent vs {rows[0]['concurrency']}",
             f"**{times(top['ratio_to_batch1'])}** (target >= {targets['ratio_32_over_1_at_least']:g}x)", "engine.md"),
        row("engine batch 1 vs Hugging Face `generate`, same checkpoint",
             f"**{times(engine['engine_batch1_speedup_over_hf_generate'])}** faster "
             f"(target >= {targets['batch1_vs_generate_at_least']:g}x)", "engine.md"),
    ]


def server_row(server: Result) -> str:
    return row(f"HTTP streaming server vs engine alone, {server['streams']} streams",
                f"**{server['cpu_overhead_fraction']:+.1%}** CPU per token "
                f"(target < {pct(server['target_overhead_fraction'])})", "server.md")


def speculative_rows(spec: Result) -> list[str]:
    def speedups(workload: str) -> tuple[list[int], list[float]]:
        cells = sorted((r["concurrency"], r["speedup"]) for r in spec["summary"]
                       if r["workload"] == workload and r["method"] == "ngram")
        return [c for c, _ in cells], [s for _, s in cells]

    rows = []
    for workload, note in (("repetitive", ""), ("random", " (the tuner's reason to be careful)")):
        batches, ratios = speedups(workload)
        shown = " / ".join(f"**{times(r)}**" if r >= 1 else times(r) for r in ratios)
        rows.append(row(f"n-gram speculation (k = {spec['num_speculative_tokens']}), {workload} text, "
                         f"batch {' / '.join(map(str, batches))}, wall clock", shown + note, "speculative.md"))
    return rows


def quant_rows(quant: Result) -> list[str]:
    rows = []
    for preset in dict.fromkeys(r["preset"] for r in quant["summary"]):
        cells = sorted((r for r in quant["summary"] if r["preset"] == preset), key=lambda r: r["concurrency"])
        batches = " / ".join(str(r["concurrency"]) for r in cells)
        wall = " / ".join(times(r["int8_speedup"]) for r in cells)
        cpu = " / ".join(times(r["int8_speedup_cpu"]) for r in cells)
        rows.append(row(f"int8 vs fp32 decode, `{preset}`, batch {batches}",
                         f"**{wall}** wall clock, {cpu} per CPU second; weights {times(cells[0]['weight_ratio'])}",
                         "quant.md"))
    return rows


def real_model_rows(real: Result) -> list[str]:
    """SmolLM2 on CPU: batch-1 decode against the bandwidth bound and the peers, streams, speculation, int8."""
    sides = {s["side"]: s for s in real["batch1"]}
    engine, streams, q = sides["engine (fp32)"], real["streams"], real["int8"]
    peer = real["llama_cpp"]
    versus_peer = (f"**{times(real['engine_speedup_over_llama_cpp'])}** llama.cpp's server (F32 GGUF) tokens/s"
                   if peer["available"] and real["engine_speedup_over_llama_cpp"] is not None
                   else f"llama.cpp not measured ({peer['why_not'].split(' (')[0]}; why in real_model.md)")
    ours = " / ".join(f"{v:.0f}" for v in streams["runtime_tokens_per_s"].values())
    theirs = streams["llama_cpp_tokens_per_s"]
    counts = " / ".join(streams["runtime_tokens_per_s"])
    spec = {s["text"]: s for s in real["speculative"]}
    return [
        row("SmolLM2-135M (fp32) batch-1 decode vs the memory-bandwidth bound (weight bytes / copy bandwidth, "
             "measured in the same run)",
             f"**{engine['tokens_per_s']:.1f} tokens/s = {pct(real['engine_fraction_of_bound'])}** of the bound "
             f"(target >= {pct(real['target_fraction_of_bound'])}; {pct(real['engine_fraction_of_read_bound'])} "
             "of the read-only bound)", "real_model.md"),
        row("SmolLM2 batch 1 vs transformers `generate` and llama.cpp, same weights",
             f"**{times(real['engine_speedup_over_hf_generate'])}** `generate`'s tokens/s; {versus_peer}",
             "real_model.md"),
        row(f"SmolLM2 through the HTTP server, {counts} concurrent streams, aggregate tokens/s",
             f"**{ours}**" + ("" if not theirs else f" (llama.cpp {' / '.join(f'{v:.0f}' for v in theirs.values())})"),
             "real_model.md"),
        row("SmolLM2 n-gram speculation (k = 4), batch 1: repetitive / free text",
             f"**{times(spec['repetitive']['speedup'])}** / {times(spec['free']['speedup'])} (acceptance "
             f"{spec['repetitive']['acceptance']:.2f} / {spec['free']['acceptance']:.2f})", "real_model.md"),
        row(f"SmolLM2 int8 weights vs fp32: batch-1 speed, greedy token agreement on the {q['probes']} quality probes",
             f"**{times(q['speedup_over_fp32'])}**, {pct(q['token_agreement'])} of tokens agree, "
             f"{q['identical_answers']} of {q['probes']} answers identical"
             + ("" if q.get("speedup_over_llama_cpp_q8") is None
                else f"; {times(q['speedup_over_llama_cpp_q8'])} llama.cpp's Q8_0 tokens/s"), "real_model.md"),
        *_prefill_rows(real.get("prefill", [])),
    ]


def _prefill_rows(prefill: list[dict[str, Any]]) -> list[str]:
    if not prefill:
        return []
    ours = " / ".join(f"{p['engine_tokens_per_s']:.0f}" for p in prefill)
    ratios = [p["engine_over_llama_cpp"] for p in prefill]
    versus = "" if None in ratios else f" = {' / '.join(times(r) for r in ratios)} llama.cpp's (F32)"
    lengths = " / ".join(str(p["prompt_tokens"]) for p in prefill)
    return [row(f"SmolLM2 prefill (fp32), {lengths}-token prompts, tokens/s", f"**{ours}**{versus}",
                 "real_model.md")]


def real_model_block(results: Path) -> str:
    real = load(results, "real_model")
    m = real["machine"]
    return block([f"Measured on the {m['cores']}-core {m['cpu_model']} with {m['torch_threads']} torch thread(s), "
                   f"load average {m['load_average_start'][0]:g} at the start and {m['load_average_end'][0]:g} at "
                   "the end (`make bench` runs `bench/bench_real_model.py`):", "",
                   "| what | result | file |", "|---|---|---|", *real_model_rows(real)])
