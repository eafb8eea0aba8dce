"""`slotune bench-tuner --scenarios DIR`: every strategy on every scenario, then the tables, JSON and plot.

Scenarios run in worker processes (one per core by default); each worker simulates a scenario's configurations once
and shares them between the strategies and the oracle.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from slotune.tunerbench.report import write_results
from slotune.tunerbench.run import ScenarioResult, run_scenario
from slotune.tunerbench.scenario import Scenario, load_scenarios


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenarios", type=Path, default=Path("bench/scenarios"), help="folder of *.yaml scenarios")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="where tuner.{json,md,png} go")
    parser.add_argument("--budget", type=int, default=12, help="applied configurations per strategy and scenario")
    parser.add_argument("--seeds", type=int, default=10, help="runs of each stochastic baseline (random, tpe)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--only", default="", help="run only scenarios whose name contains this")


def run(args: argparse.Namespace) -> int:
    scenarios = [s for s in load_scenarios(args.scenarios) if args.only in s.name]
    console = Console()
    started = time.perf_counter()
    results = _run_all(scenarios, args.budget, args.seeds, max(1, args.jobs))
    elapsed_s = time.perf_counter() - started
    summary = write_results(results, args.out, budget=args.budget, seeds=args.seeds, elapsed_s=elapsed_s)
    console.print(summary)
    return 0


def _run_all(scenarios: list[Scenario], budget: int, seeds: int, jobs: int) -> list[ScenarioResult]:
    work = partial(run_scenario, budget=budget, seeds=seeds)
    results: list[ScenarioResult] = []
    with Progress() as progress:
        task = progress.add_task("scenarios", total=len(scenarios))
        if jobs == 1:
            for scenario in scenarios:
                results.append(work(scenario))
                progress.advance(task)
        else:
            with multiprocessing.get_context("spawn").Pool(jobs) as pool:
                for result in pool.imap_unordered(work, scenarios):
                    results.append(result)
                    progress.advance(task)
    return sorted(results, key=lambda r: r.scenario)
