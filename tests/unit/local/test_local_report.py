"""Local mode's report is rewritten after every window; the PNG only when what it shows changed, so Ctrl-C never
waits for a redraw (drawing it takes seconds on a loaded machine)."""

from __future__ import annotations

import json
from pathlib import Path

from slotune.api import Observed, Phase, TunedModelStatus, load_tunedmodel
from slotune.knobs import RuntimeConfig
from slotune.local.report import ReportWriter
from slotune.snapshot import LatencySummary, MetricsSnapshot, Source

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "local-tiny.yaml"


def observed(ttft_ms: float) -> Observed:
    return Observed.of(MetricsSnapshot(
        source=Source.CLIENT, window_s=20, num_requests=80, ttft=LatencySummary.from_samples([ttft_ms] * 3),
        tpot=LatencySummary.from_samples([5.0, 6.0]), generation_tokens_per_s=100.0,
    ))


def test_the_png_is_redrawn_only_when_its_points_change(tmp_path: Path) -> None:
    writer = ReportWriter(load_tunedmodel(EXAMPLE), tmp_path)
    start = TunedModelStatus(phase=Phase.MEASURING, iteration=0, message="measuring the baseline",
                             config=RuntimeConfig())
    files = writer.write(start)
    drawn = files.plot.stat().st_mtime_ns
    writer.write(start.model_copy(update={"message": "interrupted"}))  # what Ctrl-C writes: same points
    assert files.plot.stat().st_mtime_ns == drawn
    assert json.loads(files.json.read_text())["status"]["message"] == "interrupted"
    writer.write(start.model_copy(update={"iteration": 1, "observed": observed(400.0)}))
    assert files.plot.stat().st_mtime_ns != drawn
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md", "slo.png"]  # no partials
