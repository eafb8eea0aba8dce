"""The trace replay's tally as local mode reports it (slotune.local.trace_segment): the JSON and the markdown show
the same replica-seconds."""

from __future__ import annotations

import json

from slotune.local.trace_segment import TraceSegment
from slotune.slo import SLOSpec
from slotune.traces import PlannedTrace, TraceFormat


def test_the_report_and_the_json_show_the_same_replica_seconds() -> None:
    planned = PlannedTrace((), 60.0, 1.0, 1.0, 0, 0, TraceFormat.AZURE)
    segment = TraceSegment(planned, SLOSpec.model_validate({"ttft": {"p99": 1000}}), "trace.csv")
    segment.record([], 2, 32.27)  # 64.54 replica-seconds: 64.5 in the JSON, whose whole number reads "64"
    summary = json.loads(json.dumps(segment.summary()))
    assert summary["replica_seconds"] == 64.5
    assert f"| {summary['replica_seconds']:.0f} |" in segment.markdown()
