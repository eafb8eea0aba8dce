"""A trace file as a workload: a segment of it, time-scaled to a target mean rate, lengths cut to limits, as the
same `PlannedRequest`s a generated workload gives, so the load generator, the simulator and the benchmarks replay it.

Everything is deterministic (no draws): one `TraceReplay` gives one list of requests. Scaling compresses or stretches
the trace's clock by one factor, so the shape of the traffic (bursts, lulls, per-minute peak over mean) is kept and
only its level changes. Start offset and duration are in the trace's own seconds, counted from its first arrival.
Lengths above the limits are cut to them (not dropped), so every recorded arrival still arrives.

Mooncake's `hash_ids` become `prefix_block_ids`: the ids of the prompt's full `BLOCK_TOKENS`-token blocks. The load
generator writes identical text for identical ids and the simulator caches blocks by id, so prefix caching meets the
trace's real reuse; a partial last block is left out (its id hashes fewer tokens than a full one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slotune.traces.formats import TraceFormat, TraceRow, detect_format, read_rows
from slotune.workload import PlannedRequest

BLOCK_TOKENS = 512  # Mooncake's hash block


@dataclass(frozen=True)
class TraceReplay:
    """Which part of which trace to replay, and how."""

    path: Path
    trace_format: TraceFormat | None = None  # None: detected from the file
    rate_per_s: float | None = None  # target mean arrival rate over the segment; None: as recorded
    start_s: float = 0.0  # segment start, trace seconds after its first arrival
    duration_s: float | None = None  # segment length in trace seconds; None: to the last arrival
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be positive, got {self.rate_per_s}")
        if self.start_s < 0 or (self.duration_s is not None and self.duration_s <= 0):
            raise ValueError("start_s must be >= 0 and duration_s > 0")
        for limit in (self.max_prompt_tokens, self.max_output_tokens):
            if limit is not None and limit < 1:
                raise ValueError(f"length limits must be >= 1, got {limit}")


@dataclass(frozen=True)
class PlannedTrace:
    """A replayed segment: its requests (arrivals from 0) and how it was scaled."""

    requests: tuple[PlannedRequest, ...]
    duration_s: float  # the segment's length after scaling
    recorded_rate_per_s: float  # mean arrival rate of the segment as recorded
    time_scale: float  # recorded seconds per replayed second (>1: compressed)
    num_prompts_cut: int
    num_outputs_cut: int
    trace_format: TraceFormat

    @property
    def rate_per_s(self) -> float:
        return len(self.requests) / self.duration_s if self.duration_s > 0 else 0.0


def plan_trace(replay: TraceReplay) -> PlannedTrace:
    chosen = replay.trace_format or detect_format(replay.path)
    rows = read_rows(replay.path, chosen)
    first_s = rows[0].arrival_s
    begin_s = first_s + replay.start_s
    end_s = begin_s + replay.duration_s if replay.duration_s is not None else rows[-1].arrival_s
    segment = [r for r in rows if begin_s <= r.arrival_s <= end_s]
    if not segment:
        raise ValueError(f"{replay.path}: no requests between {replay.start_s:.0f} s and "
                         f"{end_s - first_s:.0f} s of the trace")
    span_s = max(end_s - begin_s, 1e-9)
    recorded_rate = len(segment) / span_s
    scale = replay.rate_per_s / recorded_rate if replay.rate_per_s is not None else 1.0
    requests = tuple(_request(r, begin_s, scale, replay) for r in segment)
    prompts_cut = sum(replay.max_prompt_tokens is not None and r.prompt_tokens > replay.max_prompt_tokens
                      for r in segment)
    outputs_cut = sum(replay.max_output_tokens is not None and r.output_tokens > replay.max_output_tokens
                      for r in segment)
    return PlannedTrace(requests, span_s / scale, recorded_rate, scale, prompts_cut, outputs_cut, chosen)


def _request(row: TraceRow, begin_s: float, scale: float, replay: TraceReplay) -> PlannedRequest:
    prompt = min(row.prompt_tokens, replay.max_prompt_tokens or row.prompt_tokens)
    output = min(row.output_tokens, replay.max_output_tokens or row.output_tokens)
    blocks = row.block_ids[: prompt // BLOCK_TOKENS]
    return PlannedRequest((row.arrival_s - begin_s) / scale, prompt, output, None, len(blocks) * BLOCK_TOKENS,
                          prefix_block_ids=blocks)


def rate_per_minute(requests: tuple[PlannedRequest, ...] | list[PlannedRequest], duration_s: float,
                    bin_s: float = 60.0) -> np.ndarray:
    """Arrivals per second in consecutive bins of `bin_s` (the last bin may be partial; it is scaled to its length)."""
    num_bins = max(1, int(np.ceil(duration_s / bin_s)))
    counts = np.bincount(np.minimum((np.array([r.arrival_s for r in requests]) // bin_s).astype(int),
                                    num_bins - 1), minlength=num_bins)
    widths = np.full(num_bins, bin_s)
    widths[-1] = max(duration_s - bin_s * (num_bins - 1), 1e-9)
    return counts / widths
