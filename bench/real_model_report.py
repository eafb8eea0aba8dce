"""bench/results/real_model.md from the result bench/bench_real_model.py records."""

from __future__ import annotations

from typing import Any


def _gbs(value: float) -> str:
    return f"{value / 1e9:.1f} GB/s"


def _prefill_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["", "## Prefill", "", "Prompt tokens/s of one fresh prompt (no prefix-cache hit), fp32, from the request "
             "to the first token on the engine, llama.cpp's own `prompt_per_second` (F32); median of the rounds, "
             "alternating.", "", "| prompt tokens | slotune runtime | llama.cpp server (F32) | ratio |",
             "|---|---|---|---|"]
    for row in rows:
        peer, ratio = row["llama_cpp_tokens_per_s"], row["engine_over_llama_cpp"]
        theirs = "not measured" if peer is None else f"{peer:.0f}"
        lines.append(f"| {row['prompt_tokens']} | {row['engine_tokens_per_s']:.0f} | {theirs} | "
                     f"{'' if ratio is None else f'**{ratio:.2f}x**'} |")
    return lines


def markdown(r: dict[str, Any]) -> str:
    m, model, bw, setup = r["machine"], r["model"], r["bandwidth"], r["setup"]
    lines = [
        "# A real model: SmolLM2-135M-Instruct on CPU (bench/bench_real_model.py)",
        "",
        f"Machine: {m['cpu_model']}, {m['cores']} cores, torch {m['torch']}, {m['torch_threads']} torch thread(s); "
        f"load average (1/5/15 min) {' / '.join(map(str, m['load_average_start']))} at the start, "
        f"{' / '.join(map(str, m['load_average_end']))} at the end.",
        f"Model: `{model['source']}` served in fp32, {model['params'] / 1e6:.1f}M params; a decode step reads "
        f"{model['weight_bytes_per_token'] / 1e6:.0f} MB of weights (int8: "
        f"{model['int8_weight_bytes_per_token'] / 1e6:.0f} MB). {setup['rounds']} alternating rounds, "
        f"{setup['max_tokens']} new tokens after a {setup['prompt_tokens']}-token prompt, greedy.",
        "",
        "## Batch-1 decode against the bandwidth bound",
        "",
        f"Copy bandwidth (bytes read + written per second, median of {len(bw['copy_samples'])} samples taken "
        f"between the decode runs): {_gbs(bw['copy_bytes_per_s_median'])}, so the bound is "
        f"**{bw['bound_ms_per_token']:.1f} ms/token**. Read-only bandwidth (a sum over the same buffer): "
        f"{_gbs(bw['read_bytes_per_s_median'])}, bound {bw['read_bound_ms_per_token']:.1f} ms/token.",
        "",
        "| side | ms/token | tokens/s | of the copy bound | of the read bound | rounds (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for s in r["batch1"]:
        lines.append(f"| {s['side']} | {s['ms_per_token']:.1f} | {s['tokens_per_s']:.1f} | "
                     f"{s['fraction_of_copy_bound']:.0%} | {s['fraction_of_read_bound']:.0%} | "
                     f"{', '.join(f'{v:.0f}' for v in s['rounds_ms'])} |")
    verdict = "meets" if r["engine_fraction_of_bound"] >= r["target_fraction_of_bound"] else "misses"
    lines += [
        "",
        f"Engine batch 1 at **{r['engine_fraction_of_bound']:.0%} of the copy-bandwidth bound** (median of the "
        f"rounds' paired ratios {', '.join(f'{v:.0%}' for v in r['engine_fraction_of_bound_rounds'])}, each against "
        f"the copies just before and after it; {r['engine_fraction_of_read_bound']:.0%} of the median read bound): "
        f"{verdict} the target of "
        f"{r['target_fraction_of_bound']:.0%}. Against transformers `generate`: "
        f"**{r['engine_speedup_over_hf_generate']:.2f}x**; against its own row-major weights (before "
        f"gpu_runtime/model/cpu_layout.py), median of the rounds' paired ratios: "
        f"{r['engine_speedup_over_row_major']:.2f}x "
        f"({', '.join(f'{v:.2f}' for v in r['engine_speedup_over_row_major_rounds'])}).",
    ]
    if "gemv" in r:
        g = r["gemv"]
        lines += [
            "",
            f"Kernels, side by side in every round: {g['what']}. The engine is **{g['engine_speedup']:.2f}x** "
            f"faster (median of the rounds' paired ratios "
            f"{', '.join(f'{v:.2f}' for v in g['engine_speedup_rounds'])}; by CPU time "
            f"{r['cpu_time']['gemv_speedup']:.2f}x); on PyTorch ops with MKL it runs at "
            f"{g['mkl_fraction_of_bound']:.0%} of the bound. Huge pages: "
            f"THP_MEM_ALLOC_ENABLE={m['huge_pages']['THP_MEM_ALLOC_ENABLE']}, "
            f"{(m['huge_pages']['anon_huge_page_bytes'] or 0) / 2**20:.0f} MiB of the process in huge pages "
            "(weights and the copy bound's buffers alike).",
        ]
    if "before" in r:
        b, c = r["before"], r["cpu_time"]
        lines += [
            "",
            f"Before and after this revision's C batch-1 kernels, side by side (the runtime at {b['revision']}, "
            f"loaded into the same process, alternating with the current one in every round): {b['what']}. "
            f"By wall time the engine is **{b['engine_speedup']:.2f}x** its earlier self (median of the rounds' "
            f"paired ratios "
            f"{', '.join(f'{v:.2f}' for v in b['engine_speedup_rounds'])}); before: "
            f"{b['fraction_of_bound']:.0%} of the bound.",
            "",
            f"The same by thread CPU time (decode steps and copies alike, so a core lost to the machine's other "
            f"processes inflates neither): copy {_gbs(c['copy_bytes_per_s_median'])}, bound "
            f"{c['bound_ms_per_token']:.1f} ms/token; engine {c['engine_ms_per_token']:.1f} ms/token = "
            f"**{c['engine_fraction_of_bound']:.0%}** of the bound (rounds "
            f"{', '.join(f'{v:.0%}' for v in c['engine_fraction_of_bound_rounds'])}), before "
            f"{c['before_ms_per_token']:.1f} ms/token = {c['before_fraction_of_bound']:.0%}"
            + (f", the engine on MKL {c['mkl_ms_per_token']:.1f} ms/token = {c['mkl_fraction_of_bound']:.0%}; the "
               f"kernels alone (before / the engine, median of the paired ratios) {c['speedup_over_before']:.2f}x."
               if "mkl_ms_per_token" in c else f"; after / before {c['speedup_over_before']:.2f}x."),
        ]
    peer = r["llama_cpp"]
    if peer["available"] and r["engine_speedup_over_llama_cpp"] is not None:
        check = peer.get("greedy_check")
        same = ("" if check is None else f" Same weights: its greedy continuation of the decode prompt equals the "
                f"engine's for the first {check['equal_prefix_tokens']} of {check['tokens']} tokens.")
        lines.append(f"Against llama.cpp's server on the same weights (the Q4_1 file requantized to F32 by "
                     f"llama-quantize, so both sides run the same values in fp32): "
                     f"{r['engine_speedup_over_llama_cpp']:.2f}x (above 1 = the engine is faster).{same}")
    else:
        lines.append(f"llama.cpp: not measured: {peer['why_not']}")
    lines += ["", ("Where a batch-1 decode step spends its torch op time (torch profiler, self CPU time; "
                     "the C kernels' decoder layers and numpy's LM-head GEMV are not torch ops and are not in it):" if
                     r["machine"].get("numpy_blas") else
                     "Where a batch-1 decode step spends its op time (torch profiler, self CPU time):"), "",
              "| op | share | calls per step |", "|---|---|---|"]
    lines += [f"| `{p['op']}` | {p['share']:.0%} | {p['calls_per_step']} |" for p in r["profile_top_ops"]]
    streams = r["streams"]
    lines += ["", "## Concurrent streams through the HTTP server", "",
              f"Aggregate output tokens/s, {streams['max_tokens']} tokens per request, distinct prompts, all sent at "
              f"once; wall time from the first send to the last answer (prefill included); median of "
              f"{streams['rounds']} rounds.", "", "| streams | slotune runtime | llama.cpp server (F32) |",
              "|---|---|---|"]
    theirs = streams["llama_cpp_tokens_per_s"] or {}
    for n, ours in streams["runtime_tokens_per_s"].items():
        lines.append(f"| {n} | {ours:.1f} | {theirs.get(n, 'not measured')} |")
    lines += ["", "## n-gram speculation", "",
              f"`{setup['speculative_config']}`, one request, greedy; decode tokens/s from the first output token to "
              "the last, median over rounds, on and off alternating.", "",
              "| text | prompt tokens | tokens/s off | tokens/s on | speedup | acceptance | greedy output unchanged "
              "| plain output = a fresh engine's |", "|---|---|---|---|---|---|---|---|"]
    for s in r["speculative"]:
        acceptance = "n/a" if s["acceptance"] is None else f"{s['acceptance']:.2f}"
        lines.append(f"| {s['text']} | {s['prompt_tokens']} | {s['tokens_per_s_plain']:.1f} | "
                     f"{s['tokens_per_s_speculative']:.1f} | **{s['speedup']:.2f}x** | {acceptance} | "
                     f"{s['greedy_output_unchanged']} | {s.get('plain_output_as_fresh_engine', 'not checked')} |")
    q = r["int8"]
    lines += ["", "## int8 weights", "",
              f"Batch-1 decode: **{q['speedup_over_fp32']:.2f}x** the fp32 engine's tokens/s"
              + ("" if "speedup_over_pytorch_path" not in q else
                 f", **{q['speedup_over_pytorch_path']:.2f}x** its PyTorch path (no compiler: the head in fp32)")
              + ("" if "speedup_over_fp32_head" not in q else
                 f", **{q['speedup_over_fp32_head']:.2f}x** int8 with the embedding and output head in fp32 (before "
                 "the int8 head)")
              + f". Quality against fp32, greedy, the quality gate's {q['probes']} probe conversations, "
              f"{q['quality_tokens']} tokens each, all at once (batched steps): {_agreement_text(q)}."
              + "".join(f" {name}: {_agreement_text(q[key])}." for key, name in (
                  ("batch1", "One at a time (batch-1 steps, the C kernels)"),
                  ("batch1_pytorch_path", "One at a time on the PyTorch path"),
                  ("fp32_head", "With the embedding and head in fp32 (before), all at once"),
                  ("fp32_head_batch1", "With the embedding and head in fp32 (before), one at a time")) if key in q)
              + ("" if q.get("speedup_over_llama_cpp_q8") is None else
                 f" Against llama.cpp's server on the same weights in Q8_0 (its 8-bit format): "
                 f"**{q['speedup_over_llama_cpp_q8']:.2f}x** (above 1 = the engine is faster)."),
              *_prefill_lines(r.get("prefill", [])),
              "", "Other processes shared the machine during the run (see the load averages): absolute times are "
              "inflated; the ratios, measured side by side in alternating rounds, are the result.", ""]
    return "\n".join(lines)


def _agreement_text(q: dict[str, Any]) -> str:
    return (f"token agreement **{q['token_agreement']:.0%}**, {q['identical_answers']} of {q['probes']} answers "
            f"identical, first divergence after {q['mean_tokens_to_first_divergence']:.1f} tokens on average")
