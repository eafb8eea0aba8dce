"""The README's benchmark numbers, rendered from bench/results/*.json so no number in it is ever typed by hand.

Each rendered piece of README.md sits between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`; this script replaces
what lies between the markers and nothing else. Every region it renders must be in the README and every region in the
README must be one it renders, so a deleted marker or a stray one fails loudly instead of leaving a stale number.
Pure file reading (no torch, no slotune): fast enough to run after every benchmark and in the unit tests.

    .venv/bin/python -m bench.readme_numbers           # rewrite README.md
    .venv/bin/python -m bench.readme_numbers --check   # exit 1 if README.md is not what the results render

The renderers live beside it, one file a subject: readme_demo, readme_runtime, readme_tuner, readme_simulator (and
readme_format, how they all write numbers); the regions below that are a few lines each stay here.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from bench.readme_demo import demo_intro, demo_miss, demo_run, demo_table
from bench.readme_format import Result, block, load, machines, pct, row
from bench.readme_runtime import engine_rows, quant_rows, real_model_block, server_row, speculative_rows
from bench.readme_simulator import simulator_counts, simulator_row, simulator_worst
from bench.readme_tuner import tuner_honesty_rows, tuner_rows, tuner_shortfall

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"
REGION = re.compile(r"<!-- bench:(?P<name>[a-z0-9-]+) -->(?P<body>.*?)<!-- /bench:(?P=name) -->", re.DOTALL)


def operator_scale_rows(scale: Result) -> list[str]:
    """One row per N: the operator's own costs at that many TunedModels."""
    rows = []
    for run in scale["runs"]:
        create, lag, gone = run["create_to_deployment_s"], run["tick_lag_s"], run["delete_to_gone_s"]
        rows.append(row(
            f"operator, {run['tunedmodels']} TunedModels on one replica (kwok, real Prometheus, "
            f"{run['window_s']:.0f} s windows): create->Deployment p99, tick lag p99, delete p99, SIGTERM, RSS, "
            "API server req/s (all clients), PromQL queries/s",
            f"**{create['p99']:.1f} s**, <= {lag['p99_at_most']:g} s, {gone['p99']:.2f} s, "
            f"{run['sigterm_to_exit_s']:.1f} s, {run['operator_rss_mib']:.0f} MiB, "
            f"{run['apiserver_requests_per_s_all_clients']:.0f}, {run['promql_queries_per_s']:.1f}",
            "operator_scale.md"))
    return rows


def benchmarks_block(results: Path) -> str:
    engine, server, spec, quant = (load(results, n) for n in ("engine", "server", "speculative", "quant"))
    tuner, validation = load(results, "tuner"), load(results, "simulator_validation")
    scale = load(results, "operator_scale")
    rows = [*engine_rows(engine), server_row(server), *speculative_rows(spec), *quant_rows(quant), *tuner_rows(tuner),
            *tuner_honesty_rows(tuner), simulator_row(validation), *operator_scale_rows(scale)]
    where = machines([engine, server, spec, quant, tuner, validation, scale])
    return block([f"Measured on the {where} development machine while other work shared it: read the ratios, "
                   "each measured side by side in one run.", "", "| what | result | file |", "|---|---|---|", *rows])


def canary_summary(canary: Result) -> str:
    """What bench_canary.py measured: A/A and a slower canary on real runtimes, and the simulated ramps."""
    a_a, slow = canary["real"]["a_a"], canary["real"]["slowdown"]
    ramps = [r for r in canary["ramp"] if r["rates_per_s"][0] != r["rates_per_s"][1]]
    ramp = "; ".join(f"{r['ramp']}: before/after right in {pct(r['before_after_right'])}, the canary in "
                     f"{pct(r['canary_right'])} of {r['trials']}" for r in ramps)
    exact, exact_slow = a_a["rates_exact"], slow["rates_exact"]
    return (f"Measured (`bench/results/canary.md`): on two real runtime processes sharing one load, with the pods' A/A "
            f"floor from {canary['real']['calibration_windows']} windows without a canary, an A/A canary was promoted "
            f"in {pct(a_a['rates']['promote'])} of {len(a_a['trials'])} windows (bound {pct(canary['alpha'])}) "
            f"and called worse in {pct(a_a['rates']['worse'])} (the exact test alone on the same windows: "
            f"{pct(exact['promote'])} and {pct(exact['worse'])}); a canary x{slow['ttft_p50_ratio']:.2f} slower "
            f"at TTFT P50 was rolled back at the operator's first look in {pct(slow['rolled_back_at_first_look'])} "
            f"of {len(slow['trials'])} windows, called worse in {pct(slow['rates']['worse'])} (the exact test "
            f"alone: {pct(exact_slow['worse'])}). Simulated load ramps ({ramp}).")


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
    return block(lines)


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
