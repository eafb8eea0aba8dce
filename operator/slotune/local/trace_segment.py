"""Local mode replaying a trace segment: window k of the run sends the segment's requests that arrive in
[k x window, (k+1) x window) at their (scaled) times, so the runtimes meet the trace's own bursts and lulls, and its
prefix reuse (slotune.traces); and the tally the report shows: requests meeting every SLO target, and replica-seconds
(replicas serving x measured seconds, window by window) over the segment.

A window shorter on arrivals than its length (a lull) is waited out, so the segment keeps its clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slotune.loadgen.prompts import TraceRequest
from slotune.loadgen.record import RequestRecord
from slotune.loadgen.stats import meets_slo, per_request_bounds_ms
from slotune.slo import SLOSpec
from slotune.traces import PlannedTrace, TraceReplay, plan_trace
from slotune.workload import PlannedRequest


@dataclass
class TraceSegment:
    planned: PlannedTrace
    slo: SLOSpec
    source: str
    cursor_s: float = 0.0
    num_requests: int = 0
    num_met: int = 0
    replica_s: float = 0.0
    windows: list[dict[str, float]] = field(default_factory=list)

    @classmethod
    def load(cls, replay: TraceReplay, slo: SLOSpec) -> TraceSegment:
        return cls(plan_trace(replay), slo, str(replay.path))

    def num_windows(self, window_s: float) -> int:
        return max(1, math.ceil(self.planned.duration_s / window_s))

    @property
    def done(self) -> bool:
        return self.cursor_s >= self.planned.duration_s

    def next_window(self, window_s: float) -> list[TraceRequest]:
        """The next window's requests, times from the window's start; past the end the segment replays again."""
        begin_s = self.cursor_s % self.planned.duration_s if self.planned.duration_s > 0 else 0.0
        self.cursor_s += window_s
        chosen = [r for r in self.planned.requests if begin_s <= r.arrival_s < begin_s + window_s]
        return [TraceRequest(PlannedRequest(r.arrival_s - begin_s, r.prompt_tokens, r.output_tokens, r.prefix_group,
                                            r.shared_prefix_tokens, r.prefix_block_ids), None) for r in chosen]

    def record(self, records: Sequence[RequestRecord], num_replicas: int, measured_s: float) -> None:
        measured = [r for r in records if not r.warmup]
        met = sum(meets_slo(r, per_request_bounds_ms(self.slo)) for r in measured)
        self.num_requests += len(measured)
        self.num_met += met
        self.replica_s += num_replicas * measured_s
        self.windows.append({"requests": len(measured), "met": met, "replicas": num_replicas,
                             "measured_s": round(measured_s, 3)})

    @property
    def attainment(self) -> float | None:
        return self.num_met / self.num_requests if self.num_requests else None

    @property
    def replica_seconds(self) -> float:
        """As the JSON and the markdown both show it: the markdown's whole number is this one's, rounded (from the
        unrounded sum, 64.54 read "65" in the report beside 64.5 in the JSON, whose own rounding reads "64")."""
        return round(self.replica_s, 1)

    def summary(self) -> dict[str, object]:
        return {"trace": self.source, "rate_per_s": round(self.planned.rate_per_s, 3),
                "time_scale": round(self.planned.time_scale, 4), "segment_s": round(self.planned.duration_s, 1),
                "planned_requests": len(self.planned.requests),
                "requests": self.num_requests, "met": self.num_met, "attainment": self.attainment,
                "replica_seconds": self.replica_seconds, "windows": self.windows}

    def markdown(self) -> str:
        attained = "-" if self.attainment is None else f"{self.attainment:.1%}"
        return "\n".join([
            "## Trace replay", "",
            f"`{self.source}` at {self.planned.rate_per_s:.2f} req/s (time x{self.planned.time_scale:.3f}), "
            f"{self.planned.duration_s:.0f} s segment, {len(self.windows)} window(s) replayed.", "",
            "| requests | meeting every SLO target | attainment | replica-seconds |", "|---|---|---|---|",
            f"| {self.num_requests} | {self.num_met} | {attained} | {self.replica_seconds:.0f} |", ""])

    def write(self, out: Path) -> Path:
        path = out / "trace_replay.json"
        path.write_text(json.dumps(self.summary(), indent=1) + "\n")
        return path
