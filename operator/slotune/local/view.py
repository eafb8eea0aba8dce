"""The live terminal view of `slotune tune`: where tuning stands, each SLO target against what was measured, and
why the tuner did what it did. Renders a TunedModel status; knows nothing about how it was produced."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from slotune.api import Observed, Phase, TunedModelSpec, TunedModelStatus
from slotune.slo import SLOTarget

_PHASE_STYLE = {
    Phase.CONVERGED: "bold green", Phase.INFEASIBLE: "bold red", Phase.DEGRADED: "bold red",
    Phase.TUNING: "bold yellow", Phase.VERIFYING: "bold yellow",
}


def observed_ms(observed: Observed | None, target: SLOTarget) -> float | None:
    if observed is None:
        return None
    return getattr(getattr(observed, target.metric.value), f"p{target.percentile}_ms")


def slo_table(spec: TunedModelSpec, observed: Observed | None) -> Table:
    table = Table(title="SLO", expand=True)
    for column, justify in (("metric", "left"), ("observed", "right"), ("target", "right"), ("", "left")):
        table.add_column(column, justify=justify)
    for target in spec.slo.targets():
        value = observed_ms(observed, target)
        if value is None:
            table.add_row(target.name, "-", f"{target.target_ms:.1f} ms", Text("no data", style="dim"))
            continue
        met = value <= target.target_ms
        verdict = Text("met" if met else f"{value / target.target_ms:.1f}x over", style="green" if met else "red")
        table.add_row(target.name, f"{value:.1f} ms", f"{target.target_ms:.1f} ms", verdict)
    if spec.slo.min_throughput is not None:
        tokens = observed.generation_tokens_per_s if observed else 0.0
        met = tokens >= spec.slo.min_throughput
        table.add_row("throughput", f"{tokens:.0f} tok/s", f">= {spec.slo.min_throughput:.0f} tok/s",
                      Text("met" if met else "below", style="green" if met else "red"))
    return table


def _header(name: str, status: TunedModelStatus) -> Text:
    text = Text()
    text.append(f"{name}  ", style="bold")
    text.append(status.phase.value, style=_PHASE_STYLE.get(status.phase, "bold cyan"))
    text.append(f"  iteration {status.iteration}")
    if status.observed is not None:
        text.append(f"  window {status.observed.window_s:.0f} s, {status.observed.num_requests} requests")
    if status.message:
        text.append(f"\n{status.message}", style="italic")
    return text


def _diagnosis(status: TunedModelStatus) -> RenderableType:
    if status.diagnosis is None:
        return Text("diagnosis: (waiting for the first window)", style="dim")
    lines = Text()
    lines.append("bottleneck: ", style="bold")
    lines.append(status.diagnosis.bottleneck)
    for evidence in status.diagnosis.evidence:
        lines.append(f"\n  - {evidence}")
    if status.diagnosis.suggestion:
        lines.append(f"\nnext: {status.diagnosis.suggestion}", style="cyan")
    return lines


def _history(status: TunedModelStatus) -> Table:
    table = Table(title="changes", expand=True)
    for column in ("#", "change", "verdict"):
        table.add_column(column)
    for entry in status.history[-6:]:
        table.add_row(str(entry.iteration), entry.change, entry.verdict.value)
    return table


def render(name: str, spec: TunedModelSpec, status: TunedModelStatus, activity: str = "") -> RenderableType:
    config = status.config.describe() if status.config is not None else "(deploying)"
    parts: list[RenderableType] = [_header(name, status), Text(f"config: {config}")]
    if activity:
        parts.append(Text(activity, style="cyan"))
    body = Group(*parts, slo_table(spec, status.observed), _diagnosis(status), _history(status))
    return Panel(body, title="slotune tune", border_style="blue")
