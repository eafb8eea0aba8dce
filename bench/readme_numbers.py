"""The README's benchmark numbers, rendered from bench/results/*.json so no number in it is ever typed by hand.

Each rendered piece of README.md sits between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`; this script replaces
what lies between the markers and nothing else. Every region it renders must be in the README and every region in the
README must be one it renders, so a deleted marker or a stray one fails loudly instead of leaving a stale number.
Pure file reading (no torch, no slotune): fast enough to run after every benchmark and in the unit tests.

    .venv/bin/python bench/readme_numbers.py           # rewrite README.md
    .venv/bin/python bench/readme_numbers.py --check   # exit 1 if README.md is not what the results render
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"
REGION = re.compile(r"<!-- bench:(?P<name>[a-z0-9-]+) -->(?P<body>.*?)<!-- /bench:(?P=name) -->", re.DOTALL)
# validate_simulator.py's target (a goal, not a measurement): a percentile within 25% of the measured one.
SIMULATOR_TOLERANCE = 0.25
# The tuner benchmark's bar for "near the oracle" (tunerbench: configs until one within 95% of its goodput).
NEAR_ORACLE = 0.95

Result = dict[str, Any]  # one parsed result file; read only in this module's renderers


def load(results: Path, name: str) -> Result:
    return json.loads((results / f"{name}.json").read_text())


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def _count(value: float) -> str:
    """Configurations counts: medians can be halves (3.5), never more precise."""
    return f"{round(value, 1):g}"


def _pct(fraction: float) -> str:
    return f"{fraction:.0%}"


def _row(what: str, result: str, file: str) -> str:
    return f"| {what} | {result} | `bench/results/{file}` |"


def engine_rows(engine: Result) -> list[str]:
    rows = sorted(engine["engine"], key=lambda r: r["concurrency"])
    top, model = rows[-1], engine["model"]
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(model["dtype"], model["dtype"])
    targets = engine["targets"]
    return [
        _row(f"engine, `{model['preset']}` ({model['params'] / 1e6:.0f}M, {dtype}) decode tokens/s, "
             f"{top['concurrency']} concurrent vs {rows[0]['concurrency']}",
             f"**{_x(top['ratio_to_batch1'])}** (target >= {targets['ratio_32_over_1_at_least']:g}x)", "engine.md"),
        _row("engine batch 1 vs Hugging Face `generate`, same checkpoint",
             f"**{_x(engine['engine_batch1_speedup_over_hf_generate'])}** faster "
             f"(target >= {targets['batch1_vs_generate_at_least']:g}x)", "engine.md"),
    ]


def server_row(server: Result) -> str:
    return _row(f"HTTP streaming server vs engine alone, {server['streams']} streams",
                f"**{server['cpu_overhead_fraction']:+.1%}** CPU per token "
                f"(target < {_pct(server['target_overhead_fraction'])})", "server.md")


def speculative_rows(spec: Result) -> list[str]:
    def speedups(workload: str) -> tuple[list[int], list[float]]:
        cells = sorted((r["concurrency"], r["speedup"]) for r in spec["summary"]
                       if r["workload"] == workload and r["method"] == "ngram")
        return [c for c, _ in cells], [s for _, s in cells]

    rows = []
    for workload, note in (("repetitive", ""), ("random", " (the tuner's reason to be careful)")):
        batches, ratios = speedups(workload)
        shown = " / ".join(f"**{_x(r)}**" if r >= 1 else _x(r) for r in ratios)
        rows.append(_row(f"n-gram speculation (k = {spec['num_speculative_tokens']}), {workload} text, "
                         f"batch {' / '.join(map(str, batches))}, wall clock", shown + note, "speculative.md"))
    return rows


def quant_rows(quant: Result) -> list[str]:
    rows = []
    for preset in dict.fromkeys(r["preset"] for r in quant["summary"]):
        cells = sorted((r for r in quant["summary"] if r["preset"] == preset), key=lambda r: r["concurrency"])
        batches = " / ".join(str(r["concurrency"]) for r in cells)
        wall = " / ".join(_x(r["int8_speedup"]) for r in cells)
        cpu = " / ".join(_x(r["int8_speedup_cpu"]) for r in cells)
        rows.append(_row(f"int8 vs fp32 decode, `{preset}`, batch {batches}",
                         f"**{wall}** wall clock, {cpu} per CPU second; weights {_x(cells[0]['weight_ratio'])}",
                         "quant.md"))
    return rows


def tuner_rows(tuner: Result) -> list[str]:
    by = {s["strategy"]: s for s in tuner["summary"]}
    ours, others = by["slotune"], [s for name, s in by.items() if name != "slotune"]
    scenarios = tuner["scenarios"]
    num_feasible = sum(1 for s in scenarios if s["feasible"])

    def spread(s: Result, key: str, stats: tuple[str, ...]) -> str:
        return " / ".join(f"{s[f'{key}_{stat}']:.1f}" if stat == "mean" else _count(s[f"{key}_{stat}"])
                          for stat in stats)

    def versus(key: str, stats: tuple[str, ...]) -> str:
        return f"slotune **{spread(ours, key, stats)}**; " + "; ".join(
            f"{_name(s['strategy'])} {spread(s, key, stats)}" for s in others)

    expected = tuner.get("random_expected")
    exact = "" if not expected else (f"; uniform random search in exact expectation {_count(expected['median'])} / "
                                     f"{_count(expected['p90'])} / {expected['mean']:.1f}")
    fresh = [r["fresh_met"] for s in scenarios if s["feasible"] for r in s["results"]
             if r["strategy"] == "slotune" and r.get("fresh_met") is not None]
    held = sum(f == 3 for f in fresh)
    on_evidence = ours.get("infeasible_on_evidence", 0)
    within = ours.get("infeasible_within_bound_of_evidence", 0)
    most = ours.get("changes_after_evidence_max")
    # Called with no such window before: the changes each took, so the README shows how long "the rest" took.
    rest = sorted(r["changes_to_infeasible"] for s in scenarios if not s["feasible"] for r in s["results"]
                  if r["strategy"] == "slotune" and r["declared_infeasible"] and r.get("changes_at_evidence") is None
                  and r.get("changes_to_infeasible") is not None)
    recognised = f"{ours['infeasible_recognised']}/{ours['infeasible_total']}"
    wrongly = "none" if ours["false_infeasible"] == 0 else str(ours["false_infeasible"])
    goodput = ", ".join(f"{_name(s['strategy'])} {s['goodput_ratio_mean']:.2f}" for s in others)
    return [
        _row(f"tuner, {len(scenarios)} simulated scenarios ({num_feasible} feasible; hardware skewed from the tuner's "
             "model; a config counts only if it meets the SLO on every scored window of traffic), configs applied "
             "until the SLO holds, median / p90 / mean", versus("configs_to_slo", ("median", "p90", "mean")) + exact,
             "tuner.md"),
        _row(f"tuner, configs until one within {NEAR_ORACLE:.0%} of the oracle's goodput, median / p90 "
             f"(budget {tuner['budget']}; {tuner['budget'] + 1} = never)",
             versus("configs_to_near_oracle", ("median", "p90")), "tuner.md"),
        _row("tuner, infeasible scenarios recognised",
             f"slotune **{recognised}**, {wrongly} wrongly; baselines cannot tell", "tuner.md"),
        _row("tuner, infeasible called within 2 changes of the first window whose evidence sufficed (the model: a "
             "target below every allowed floor, or a load far beyond maxReplicas; measured at the roomiest allowed "
             "config: TTFT and TPOT both missed, or one missed by more than the other's room with the load beyond "
             "maxReplicas)",
             f"slotune **{within} of {on_evidence}**"
             + ("" if most is None else f", at most {most} change{'' if most == 1 else 's'} after it")
             + f"; {ours['infeasible_recognised'] - on_evidence} more called once the remedies left were tried"
             + ("" if not rest else f" (after {', '.join(map(str, rest))} changes)"), "tuner.md"),
        _row("tuner, slotune's final config meets the SLO on 3 fresh windows of traffic no strategy measured",
             f"**{held} of {len(fresh)}** feasible scenarios ({sum(fresh)} of {3 * len(fresh)} windows)", "tuner.md"),
        _row("tuner, final goodput / exhaustive oracle, median / mean",
             f"slotune **{ours['goodput_ratio_median']:.2f} / {ours['goodput_ratio_mean']:.2f}**; {goodput} (mean)",
             "tuner.md"),
    ]


def tuner_honesty_rows(tuner: Result) -> list[str]:
    """slotune's decisions judged noise-free (tunerbench.honesty_report), over every scenario; none in older files."""
    total = next((f for f in tuner.get("honesty", []) if f["family"] == "all"), None)
    if total is None:
        return []
    above, unneeded = total["above_oracle"], total["unneeded_output_changes"]
    return [_row(
        "tuner, slotune's decisions judged noise-free (noisy machines vary only what it measures): false keeps, "
        "false rollbacks, scenarios resting on more GPUs than the oracle, output-altering changes the SLO did not "
        "need, windows missed because of a trim",
        f"**{total['false_keeps']} of {total['keeps']}** keeps; **{total['false_rollbacks']} of "
        f"{total['changes_judged']}** changes; **{len(above)}** of {total['scenarios']}"
        + (f" ({', '.join(above)})" if above else "") + f"; **{len(unneeded)}**"
        + (f" ({', '.join(unneeded)})" if unneeded else "")
        + f"; **{total['windows_missed_after_trim']}** of {total['windows_measured']} windows", "tuner.md")]


def operator_scale_rows(scale: Result) -> list[str]:
    """One row per N: the operator's own costs at that many TunedModels."""
    rows = []
    for run in scale["runs"]:
        create, lag, gone = run["create_to_deployment_s"], run["tick_lag_s"], run["delete_to_gone_s"]
        rows.append(_row(
            f"operator, {run['tunedmodels']} TunedModels on one replica (kwok, real Prometheus, "
            f"{run['window_s']:.0f} s windows): create->Deployment p99, tick lag p99, delete p99, SIGTERM, RSS, "
            "API server req/s (all clients), PromQL queries/s",
            f"**{create['p99']:.1f} s**, <= {lag['p99_at_most']:g} s, {gone['p99']:.2f} s, "
            f"{run['sigterm_to_exit_s']:.1f} s, {run['operator_rss_mib']:.0f} MiB, "
            f"{run['apiserver_requests_per_s_all_clients']:.0f}, {run['promql_queries_per_s']:.1f}",
            "operator_scale.md"))
    return rows


def real_model_rows(real: Result) -> list[str]:
    """SmolLM2 on CPU: batch-1 decode against the bandwidth bound and the peers, streams, speculation, int8."""
    sides = {s["side"]: s for s in real["batch1"]}
    engine, streams, q = sides["engine (fp32)"], real["streams"], real["int8"]
    peer = real["llama_cpp"]
    versus_peer = (f"**{_x(real['engine_speedup_over_llama_cpp'])}** llama.cpp's server (F32 GGUF) tokens/s"
                   if peer["available"] and real["engine_speedup_over_llama_cpp"] is not None
                   else f"llama.cpp not measured ({peer['why_not'].split(' (')[0]}; why in real_model.md)")
    ours = " / ".join(f"{v:.0f}" for v in streams["runtime_tokens_per_s"].values())
    theirs = streams["llama_cpp_tokens_per_s"]
    counts = " / ".join(streams["runtime_tokens_per_s"])
    spec = {s["text"]: s for s in real["speculative"]}
    return [
        _row("SmolLM2-135M (fp32) batch-1 decode vs the memory-bandwidth bound (weight bytes / copy bandwidth, "
             "measured in the same run)",
             f"**{engine['tokens_per_s']:.1f} tokens/s = {_pct(real['engine_fraction_of_bound'])}** of the bound "
             f"(target >= {_pct(real['target_fraction_of_bound'])}; {_pct(real['engine_fraction_of_read_bound'])} "
             "of the read-only bound)", "real_model.md"),
        _row("SmolLM2 batch 1 vs transformers `generate` and llama.cpp, same weights",
             f"**{_x(real['engine_speedup_over_hf_generate'])}** `generate`'s tokens/s; {versus_peer}",
             "real_model.md"),
        _row(f"SmolLM2 through the HTTP server, {counts} concurrent streams, aggregate tokens/s",
             f"**{ours}**" + ("" if not theirs else f" (llama.cpp {' / '.join(f'{v:.0f}' for v in theirs.values())})"),
             "real_model.md"),
        _row("SmolLM2 n-gram speculation (k = 4), batch 1: repetitive / free text",
             f"**{_x(spec['repetitive']['speedup'])}** / {_x(spec['free']['speedup'])} (acceptance "
             f"{spec['repetitive']['acceptance']:.2f} / {spec['free']['acceptance']:.2f})", "real_model.md"),
        _row(f"SmolLM2 int8 weights vs fp32: batch-1 speed, greedy token agreement on the {q['probes']} quality probes",
             f"**{_x(q['speedup_over_fp32'])}**, {_pct(q['token_agreement'])} of tokens agree, "
             f"{q['identical_answers']} of {q['probes']} answers identical"
             + ("" if q.get("speedup_over_llama_cpp_q8") is None
                else f"; {_x(q['speedup_over_llama_cpp_q8'])} llama.cpp's Q8_0 tokens/s"), "real_model.md"),
        *_prefill_rows(real.get("prefill", [])),
    ]


def _prefill_rows(prefill: list[dict[str, Any]]) -> list[str]:
    if not prefill:
        return []
    ours = " / ".join(f"{p['engine_tokens_per_s']:.0f}" for p in prefill)
    ratios = [p["engine_over_llama_cpp"] for p in prefill]
    versus = "" if None in ratios else f" = {' / '.join(_x(r) for r in ratios)} llama.cpp's (F32)"
    lengths = " / ".join(str(p["prompt_tokens"]) for p in prefill)
    return [_row(f"SmolLM2 prefill (fp32), {lengths}-token prompts, tokens/s", f"**{ours}**{versus}",
                 "real_model.md")]


def real_model_block(results: Path) -> str:
    real = load(results, "real_model")
    m = real["machine"]
    return _block([f"Measured on the {m['cores']}-core {m['cpu_model']} with {m['torch_threads']} torch thread(s), "
                   f"load average {m['load_average_start'][0]:g} at the start and {m['load_average_end'][0]:g} at "
                   "the end (`make bench` runs `bench/bench_real_model.py`):", "",
                   "| what | result | file |", "|---|---|---|", *real_model_rows(real)])


def _name(strategy: str) -> str:
    return {"tpe": "Optuna TPE"}.get(strategy, strategy)


@dataclass(frozen=True)
class SimulatorCounts:
    """The validation's headline: configurations and single percentiles within tolerance."""

    num_within: int
    num_cases: int
    num_close: int
    num_percentiles: int
    median_error: float

    def describe(self, bold: bool = False) -> str:
        head = f"{self.num_within} of {self.num_cases}"
        return (f"{f'**{head}**' if bold else head} configurations within {_pct(SIMULATOR_TOLERANCE)} on all four "
                f"percentiles ({self.num_close} of {self.num_percentiles} percentiles), median error "
                f"{_pct(self.median_error)}")


def _signed_errors(case: Result) -> list[tuple[str, float]]:
    """(percentile, predicted / measured - 1) for every percentile the simulator predicted."""
    keys = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")
    return [(key.replace("_", " ").upper(), case[key]["predicted_ms"] / case[key]["measured_ms"] - 1)
            for key in keys if case[key]["predicted_ms"] is not None]


def simulator_counts(validation: Result) -> SimulatorCounts:
    cases = validation["cases"]
    errors = [[abs(e) for _, e in _signed_errors(c)] for c in cases]
    flat = [e for case in errors for e in case]
    return SimulatorCounts(num_within=sum(1 for e in errors if len(e) == 4 and max(e) <= SIMULATOR_TOLERANCE),
                           num_cases=len(cases), num_close=sum(1 for e in flat if e <= SIMULATOR_TOLERANCE),
                           num_percentiles=len(flat), median_error=statistics.median(flat))


def simulator_worst(validation: Result) -> str:
    case, (name, error) = max(((c, e) for c in validation["cases"] for e in _signed_errors(c)),
                              key=lambda pair: abs(pair[1][1]))
    return f"{case['case']} {name}, {abs(error):.0%} {'low' if error < 0 else 'high'}"


def simulator_row(validation: Result) -> str:
    cases = validation["cases"]
    runs = sorted({len(c["ttft_p50"]["measured_runs_ms"]) for c in cases})
    return _row(f"simulator vs real runtime (tiny, CPU), P50/P99 TTFT/TPOT on {len(cases)} configs, "
                f"{'-'.join(map(str, runs))} runs each",
                f"{simulator_counts(validation).describe(bold=True)}; largest miss: {simulator_worst(validation)}",
                "simulator_validation.md")


def machines(results: list[Result]) -> str:
    """'2-core AMD EPYC', or each distinct machine when the results were measured on more than one."""
    found = dict.fromkeys(f"{m.get('cores', m.get('cpu_cores'))}-core {m.get('cpu', m.get('cpu_model'))}"
                          for m in (r["machine"] for r in results))
    return " and ".join(found)


def benchmarks_block(results: Path) -> str:
    engine, server, spec, quant = (load(results, n) for n in ("engine", "server", "speculative", "quant"))
    tuner, validation = load(results, "tuner"), load(results, "simulator_validation")
    scale = load(results, "operator_scale")
    rows = [*engine_rows(engine), server_row(server), *speculative_rows(spec), *quant_rows(quant), *tuner_rows(tuner),
            *tuner_honesty_rows(tuner), simulator_row(validation), *operator_scale_rows(scale)]
    where = machines([engine, server, spec, quant, tuner, validation, scale])
    return _block([f"Measured on the {where} development machine while other work shared it: read the ratios, "
                   "each measured side by side in one run.", "", "| what | result | file |", "|---|---|---|", *rows])


def canary_summary(canary: Result) -> str:
    """What bench_canary.py measured: A/A and a slower canary on real runtimes, and the simulated ramps."""
    a_a, slow = canary["real"]["a_a"], canary["real"]["slowdown"]
    ramps = [r for r in canary["ramp"] if r["rates_per_s"][0] != r["rates_per_s"][1]]
    ramp = "; ".join(f"{r['ramp']}: before/after right in {_pct(r['before_after_right'])}, the canary in "
                     f"{_pct(r['canary_right'])} of {r['trials']}" for r in ramps)
    exact, exact_slow = a_a["rates_exact"], slow["rates_exact"]
    return (f"Measured (`bench/results/canary.md`): on two real runtime processes sharing one load, with the pods' A/A "
            f"floor from {canary['real']['calibration_windows']} windows without a canary, an A/A canary was promoted "
            f"in {_pct(a_a['rates']['promote'])} of {len(a_a['trials'])} windows (bound {_pct(canary['alpha'])}) "
            f"and called worse in {_pct(a_a['rates']['worse'])} (the exact test alone on the same windows: "
            f"{_pct(exact['promote'])} and {_pct(exact['worse'])}); a canary x{slow['ttft_p50_ratio']:.2f} slower "
            f"at TTFT P50 was rolled back at the operator's first look in {_pct(slow['rolled_back_at_first_look'])} "
            f"of {len(slow['trials'])} windows, called worse in {_pct(slow['rates']['worse'])} (the exact test "
            f"alone: {_pct(exact_slow['worse'])}). Simulated load ramps ({ramp}).")


def traces_block(traces: Result) -> str:
    """The trace benchmark (bench_traces.py): per trace and pair, each strategy's best variant with the engine config
    that did best, attainment and GPU-hours on both passes; then the foresight yardstick (one pass, the same both
    days), the cheaper engine config's, where the run has it."""
    lines = ["| trace | model on accelerator (start-up) | strategy (engine config) | attainment pass 1 / 2 | "
             "GPU-h pass 1 / 2 |", "|---|---|---|---|---|"]
    for entry in traces["traces"]:
        scaling = entry["scaling"]
        where = (f"{entry['model']} on {entry['accelerator']} x{scaling['tensor_parallel']} "
                 f"({scaling['startup_s']:.0f} s), {scaling['rate_per_s']:g} req/s")
        best: dict[str, Result] = {}
        for s in (s for s in entry["strategies"] if s.get("best", True)):
            held = best.get(s["strategy"])
            if held is None or (s["attainment"], -s["gpu_hours"]) > (held["attainment"], -held["gpu_hours"]):
                best[s["strategy"]] = s
        for s in best.values():
            lines.append(f"| {entry['trace']} | {where} | {s['strategy']} ({s['engine_config']}) | "
                         f"{s['first_pass']['attainment']:.2%} / {s['attainment']:.2%} | "
                         f"{s['first_pass']['gpu_hours']:.2f} / {s['gpu_hours']:.2f} |")
        pools = [(label, pool) for label, pool in entry.get("hindsight", {}).items() if pool["reached"]]
        if pools:
            label, pool = min(pools, key=lambda item: item[1]["gpu_hours"])
            lines.append(f"| {entry['trace']} | {where} | *hindsight pool ({label}): a yardstick, arrivals known "
                         f"ahead, no start-up* | {pool['attainment']:.2%} (one pass) | "
                         f"{pool['gpu_hours']:.2f} (one pass) |")
    return _block(lines)


def _block(lines: list[str]) -> str:
    return "\n" + "\n".join(lines) + "\n"


def tuner_shortfall(tuner: Result) -> str:
    """The feasible scenarios where slotune ends below the near-oracle bar, each with both configurations."""
    short = [(s, r) for s in tuner["scenarios"] if s["feasible"] for r in s["results"]
             if r["strategy"] == "slotune" and (r["final_goodput_ratio"] or 0.0) < NEAR_ORACLE]
    num_feasible = sum(1 for s in tuner["scenarios"] if s["feasible"])
    if not short:
        return (f"On the tuner benchmark slotune's final goodput is within {NEAR_ORACLE:.0%} of the oracle's on every "
                f"feasible scenario ({num_feasible}).")
    cases = "; ".join(f"{s['scenario']}, {r['final_goodput_ratio'] or 0.0:.2f}: the oracle runs "
                      f"`{s['oracle_config']}`, slotune stops at `{r['final_config']}`" for s, r in short)
    return (f"On the tuner benchmark slotune's final goodput is below {NEAR_ORACLE:.0%} of the oracle's on "
            f"{len(short)} of {num_feasible} feasible scenarios ({cases}).")


def _observed_ms(observed: Result, metric: str, percentile: int) -> str:
    value = observed.get(metric, {}).get(f"p{percentile}")
    return "-" if value is None else f"{value:.1f}"


def _targets(spec: Result) -> list[tuple[str, int, float]]:
    """(metric, percentile, target ms) in the order the report prints them (slotune.slo.SLOSpec.targets)."""
    slo = spec["slo"]
    return [(metric, p, slo[metric][f"p{p}"]) for metric in ("ttft", "tpot", "e2e") if metric in slo
            for p in (50, 95, 99) if f"p{p}" in slo[metric]]


def demo_points(status: Result) -> list[tuple[int, str, str, Result]]:
    """(window, what it measured, verdict, observed): the baseline, each change, the last window, as the report's
    timeline (slotune.local.report.timeline) orders them."""
    history = status.get("history", [])
    points = []
    if history and history[0].get("before"):
        points.append((max(history[0]["iteration"] - 1, 0), "baseline", "", history[0]["before"]))
    points += [(e["iteration"], e["change"], e["verdict"], e["after"]) for e in history if e.get("after")]
    last = points[-1][0] if points else -1
    if status.get("observed") and status["iteration"] > last:
        points.append((status["iteration"], "final", "", status["observed"]))
    return points


def demo_table(demo: Result) -> str:
    report = demo["report"]
    targets = _targets(report["spec"])
    header = " | ".join(f"{metric}_p{p} (<= {target:g} ms)" for metric, p, target in targets)
    lines = [f"| window | measured | verdict | {header} | tok/s |", "|---|---|---|" + "---|" * len(targets) + "---|"]
    for window, label, verdict, observed in demo_points(report["status"]):
        cells = " | ".join(_observed_ms(observed, metric, p) for metric, p, _ in targets)
        lines.append(f"| {window} | {label} | {verdict} | {cells} | {observed['generationTokensPerSecond']:.1f} |")
    return _block(lines)


def demo_miss(demo: Result) -> str:
    """How far the starting configuration misses its worst target, measured in the baseline window."""
    report = demo["report"]
    _, _, _, baseline = demo_points(report["status"])[0]
    ratio, metric, p, target = max((baseline[m][f"p{p}"] / t, m, p, t) for m, p, t in _targets(report["spec"]))
    return f"{metric.upper()} P{p} misses its {target:g} ms target {ratio:.0f}x over"


def demo_intro(demo: Result) -> str:
    machine = demo["machine"]
    return (f"A run on the {machine['cores']}-core development machine ({machine['cpu']}, 1-minute load average "
            f"{demo['load_average_1m_end']:.1f} at its end), as `bench/bench_demo.py` recorded it in "
            "`bench/results/demo.json` (the same report `make demo` writes to `runs/local-tiny/report.md`):")


def demo_run(demo: Result) -> str:
    report = demo["report"]
    return (f"The whole run took {demo['elapsed_s']:.0f} s: {report['status']['iteration']} windows of at least the "
            f"spec's {report['spec']['tuning']['windowSeconds']:g} s (the table shows the baseline, each change and "
            "the last), their warm-ups, and starting the runtime.")


def render_regions(results: Path) -> dict[str, str]:
    """Region name -> what goes between its markers. Block regions start and end with a newline."""
    demo, validation, tuner = load(results, "demo"), load(results, "simulator_validation"), load(results, "tuner")
    renderers: dict[str, Callable[[], str]] = {
        "demo-miss": lambda: demo_miss(demo),
        "demo-intro": lambda: demo_intro(demo),
        "demo-table": lambda: demo_table(demo),
        "demo-run": lambda: demo_run(demo),
        "benchmarks": lambda: benchmarks_block(results),
        "simulator-summary": lambda: simulator_counts(validation).describe(),
        "simulator-worst": lambda: simulator_worst(validation),
        "tuner-shortfall": lambda: tuner_shortfall(tuner),
        "real-model": lambda: real_model_block(results),
        "canary": lambda: canary_summary(load(results, "canary")),
        "traces": lambda: traces_block(load(results, "traces")),
    }
    return {name: render() for name, render in renderers.items()}


class RegionError(ValueError):
    """The README's markers do not match the regions this script renders."""


def rewrite(readme: str, regions: dict[str, str]) -> str:
    """The README with every region's body replaced; refuses unknown, missing or repeated regions."""
    seen: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in regions:
            raise RegionError(f"README region {name!r} is not one bench/readme_numbers.py renders")
        seen.append(name)
        return f"<!-- bench:{name} -->{regions[name]}<!-- /bench:{name} -->"

    text = REGION.sub(replace, readme)
    missing = sorted(set(regions) - set(seen))
    repeated = sorted({name for name in seen if seen.count(name) > 1})
    if missing or repeated:
        raise RegionError(f"README regions missing: {missing}; repeated: {repeated}")
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the README is stale")
    args = parser.parse_args(argv)
    current = args.readme.read_text()
    rendered = rewrite(current, render_regions(args.results))
    if args.check:
        if rendered != current:
            print(f"{args.readme} is stale: run `make readme-numbers`", file=sys.stderr)
            return 1
        return 0
    if rendered != current:
        args.readme.write_text(rendered)
        print(f"{args.readme}: numbers rendered from {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
