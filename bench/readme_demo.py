"""The README's demo: the recorded `make demo` run's table, its starting miss and how long it took."""

from __future__ import annotations

from bench.readme_format import Result, block


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
    return block(lines)


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
