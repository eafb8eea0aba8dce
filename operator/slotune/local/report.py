"""The report `slotune tune` leaves behind: JSON (the whole status), markdown (a table per iteration) and a PNG with
each SLO metric per iteration against its target, the changes annotated. Built from a TunedModel status only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from slotune.api import Observed, TunedModel, TunedModelStatus, Verdict
from slotune.local.view import observed_ms
from slotune.slo import SLOTarget

_VERDICT_COLOR = {Verdict.KEPT: "tab:green", Verdict.ROLLED_BACK: "tab:red", Verdict.FAILED: "black",
                  Verdict.BASELINE: "tab:blue", Verdict.PENDING: "tab:gray", Verdict.WORKLOAD_SHIFT: "tab:orange"}


@dataclass(frozen=True)
class ReportFiles:
    json: Path
    markdown: Path
    plot: Path


@dataclass(frozen=True)
class Point:
    """One measured window on the report's time line."""

    iteration: int
    observed: Observed
    label: str  # the change this window measured, "baseline" or "final"
    color: str


def timeline(status: TunedModelStatus) -> list[Point]:
    """The baseline window, the window after each change, and the last window, in order."""
    points: list[Point] = []
    history = status.history
    if history and history[0].before is not None:
        points.append(Point(max(history[0].iteration - 1, 0), history[0].before, "baseline", "tab:blue"))
    points += [Point(e.iteration, e.after, e.change, _VERDICT_COLOR[e.verdict]) for e in history if e.after]
    last = points[-1].iteration if points else -1
    if status.observed is not None and status.iteration > last:
        points.append(Point(status.iteration, status.observed, "final", "tab:purple"))
    return points


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown(model: TunedModel, status: TunedModelStatus) -> str:
    targets = model.spec.slo.targets()
    verdicts = {(e.iteration, e.change): e.verdict.value for e in status.history}
    lines = [
        f"# slotune tune: {model.metadata.name}", "",
        f"Final phase: **{status.phase.value}** after {status.iteration} window(s). {status.message}", "",
        f"Final config: `{status.config.describe() if status.config else '-'}`", "",
        f"Best config: `{status.best_config.describe() if status.best_config else '-'}`", "",
        "| window | measured | verdict | " + " | ".join(f"{t.name} (<= {t.target_ms:g} ms)" for t in targets)
        + " | tok/s |",
        "|---|---|---|" + "---|" * len(targets) + "---|",
    ]
    for point in timeline(status):
        cells = [_fmt(observed_ms(point.observed, t)) for t in targets]
        verdict = verdicts.get((point.iteration, point.label), "")
        lines.append(f"| {point.iteration} | {point.label} | {verdict} | {' | '.join(cells)} | "
                     f"{point.observed.generation_tokens_per_s:.1f} |")
    lines += quality_lines(status)
    if status.diagnosis is not None:
        lines += ["", f"## Last diagnosis: {status.diagnosis.bottleneck}", ""]
        lines += [f"- {line}" for line in status.diagnosis.evidence]
        if status.diagnosis.suggestion:
            lines += ["", f"Suggestion: {status.diagnosis.suggestion}"]
    return "\n".join(lines) + "\n"


def quality_lines(status: TunedModelStatus) -> list[str]:
    """Every change the quality gate judged (slotune.quality), with its verdict and numbers, read from the history
    entry's detail, where the loop writes the gate's reason ("quality holds: ...", "quality: ...")."""
    rows = []
    for entry in status.history:
        detail = entry.reason.rpartition(" | ")[2]
        start = detail.find("quality")
        if start >= 0:
            rows.append(f"| {entry.iteration} | {entry.change} | {entry.verdict.value} | {detail[start:]} |")
    if not rows:
        return []
    return ["", "## Quality gate (probe set before and after each output-altering change)", "",
            "| window | change | verdict | measured |", "|---|---|---|---|", *rows]


def _plot_target(axis: Axes, target: SLOTarget, points: list[Point]) -> None:
    xs = [p.iteration for p in points]
    ys = [observed_ms(p.observed, target) for p in points]
    axis.plot(xs, [y if y is not None else float("nan") for y in ys], color="tab:gray", linewidth=1, zorder=1)
    for point, y in zip(points, ys, strict=True):
        if y is None:
            continue
        axis.scatter([point.iteration], [y], color=point.color, zorder=2, s=30)
        axis.annotate(point.label, (point.iteration, y), textcoords="offset points", xytext=(4, 6), fontsize=7,
                      rotation=15)
    axis.axhline(target.target_ms, color="tab:red", linestyle="--", linewidth=1, label=f"target {target.target_ms:g}")
    axis.set_ylabel(f"{target.name} (ms)")
    axis.set_yscale("log")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.legend(loc="upper right", fontsize=8)


def plot(model: TunedModel, status: TunedModelStatus, path: Path) -> None:
    targets = model.spec.slo.targets()
    points = timeline(status)
    # The object API needs no pyplot state and no GUI backend, so it is safe from threads and headless machines.
    figure = Figure(figsize=(9, 2.6 * len(targets)))
    axes = figure.subplots(len(targets), 1, sharex=True, squeeze=False)
    for axis, target in zip(axes[:, 0], targets, strict=True):
        _plot_target(axis, target, points)
    axes[-1, 0].set_xlabel("window (blue: baseline, green: change kept, red: rolled back, black: failed)")
    figure.suptitle(f"{model.metadata.name}: SLO metrics per window")  # the phase is in report.md
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def write_report(model: TunedModel, status: TunedModelStatus, out_dir: Path) -> ReportFiles:
    return ReportWriter(model, out_dir).write(status)


class ReportWriter:
    """Rewrites the report after every window, so a run stopped at any point (Ctrl-C, SIGTERM, even SIGKILL)
    leaves one that says where it stood. The PNG is redrawn only when what it shows changed: drawing it costs about
    half a CPU second, several seconds on a loaded machine, and Ctrl-C must not wait for it."""

    def __init__(self, model: TunedModel, out_dir: Path) -> None:
        self.model = model
        self.files = ReportFiles(out_dir / "report.json", out_dir / "report.md", out_dir / "slo.png")
        self._plotted: tuple[object, ...] | None = None  # what the PNG on disk shows

    def write(self, status: TunedModelStatus) -> ReportFiles:
        self.files.json.parent.mkdir(parents=True, exist_ok=True)
        body = {"metadata": {"name": self.model.metadata.name}, "spec": self.model.wire()["spec"],
                "status": status.model_dump(by_alias=True, mode="json", exclude_none=True)}
        _replace(self.files.json, json.dumps(body, indent=2) + "\n")
        _replace(self.files.markdown, markdown(self.model, status))
        shown = tuple(timeline(status))
        if shown != self._plotted or not self.files.plot.exists():
            partial = self.files.plot.with_name(f".{self.files.plot.name}")
            plot(self.model, status, partial)
            partial.replace(self.files.plot)
            self._plotted = shown
        return self.files


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` atomically: a run killed mid-write never leaves half a report."""
    partial = path.with_name(f".{path.name}")
    partial.write_text(text)
    partial.replace(path)
