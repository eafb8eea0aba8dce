"""The report's line on why slotune's cost is short (slotune.tracebench.why): measured replicas on each side and the
capacity slotune planned with, only when the goal check finds the cost short."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from slotune.snapshot import MetricsSnapshot, Source
from slotune.tracebench.goal import check
from slotune.tracebench.metrics import PassFigures, StrategyFigures
from slotune.tracebench.replay import Replayed, WindowPoint
from slotune.tracebench.run import CaseResult
from slotune.tracebench.why import mean_replicas, shortfall

PASS_S = 600.0


def replayed(strategy: str, engine: str, replicas: list[int], note: str = "", rate_per_s: float = 1.0) -> Replayed:
    run = Replayed(strategy, engine, "", (), PASS_S, final_config="seqs=64", capacity_note=note)
    snapshot = MetricsSnapshot(Source.SIMULATOR, 60.0, 60)
    run.windows = [WindowPoint(60.0 * (i + 1), rate_per_s, n, 0, 0.0, snapshot) for i, n in enumerate(replicas)]
    return run


def figures(strategy: str, engine: str, gpu_hours: float, attainment: float = 1.0) -> StrategyFigures:
    second = PassFigures(attainment=attainment, window_attainment=1.0, gpu_hours=gpu_hours, changes_per_hour=0.0,
                         worst_window=1.0)
    return StrategyFigures(strategy, engine, "", "", second, second)


def result(ours_hours: float) -> CaseResult:
    runs = (replayed("slotune", "tuned", [5] * 10 + [4] * 10, "6.00 req/s per replica, x1.00 the model's capacity"),
            replayed("static-peak", "default", [3] * 20), replayed("static-peak", "oracle", [3] * 20))
    figs = (figures("slotune", "tuned", ours_hours), figures("static-peak", "default", 0.85, 0.992),
            figures("static-peak", "oracle", 0.85))
    none: Any = None
    return CaseResult(none, none, figs, runs, {}, {"default": 8.0, "oracle": 8.0}, {"default": 3, "oracle": 3})


def test_the_mean_replicas_of_a_pass_count_its_own_windows_only() -> None:
    run = replayed("slotune", "tuned", [5] * 10 + [4] * 10)
    assert mean_replicas(run, 0) == 5.0 and mean_replicas(run, 1) == 4.0


def test_a_short_cost_says_how_many_replicas_ran_and_what_capacity_was_planned_with() -> None:
    short = result(1.30)
    checked = check(short.figures)
    assert checked is not None and not checked.met
    line = shortfall(short, checked)
    assert "slotune ran 4.0 replicas on average in pass 2 for 100.00% of requests (the goal asks 100.00%" in line
    assert "static-peak (default) 3.0 for 99.20%" in line and "static-peak (oracle) 3.0 for 100.00%" in line
    assert "6.00 req/s per replica" in line and "default 8.00" in line


def split_at(planned_per_s: float) -> str:
    """The short line where every window brought 14 req/s and slotune planned with `planned_per_s` per replica."""
    short = result(1.30)
    ours = short.runs[0]
    ours.windows = [replace(w, arrival_rate_per_s=14.0) for w in ours.windows]
    ours.planned_per_replica = [planned_per_s] * len(ours.windows)
    checked = check(short.figures)
    assert checked is not None
    return shortfall(short, checked)


def test_the_excess_splits_into_replicas_ahead_of_the_load_and_capacity_not_counted_on() -> None:
    line = split_at(6.0)  # 14 req/s at 6 each: 3 replicas; at the oracle's 8: 2
    assert "needed 3.0 replicas on average at the capacity slotune planned with and 2.0 at the oracle" in line
    assert "+1.0 replicas ran ahead of the measured load" in line and "+1.0 for planning under" in line


def test_planning_above_one_replicas_profiled_capacity_is_said_so() -> None:
    line = split_at(16.0)  # 14 req/s at 16 each: 1 replica; at the oracle's 8: 2
    assert "-1.0 for planning above it" in line and "under the profiled" not in line


def test_without_a_planned_capacity_per_window_the_split_is_left_out() -> None:
    short = result(1.30)
    checked = check(short.figures)
    assert checked is not None and "ran ahead" not in shortfall(short, checked)


def test_nothing_is_said_when_the_cost_meets_the_goal() -> None:
    cheap = result(0.50)
    checked = check(cheap.figures)
    assert checked is not None and shortfall(cheap, checked) == ""

