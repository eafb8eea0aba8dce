"""Recorded production traces as workloads: the Azure LLM inference CSV and the Mooncake JSONL, read, cut and
time-scaled into the same `PlannedRequest`s a generated workload gives (slotune.traces.replay)."""

from slotune.traces.formats import TraceFormat, TraceRow, detect_format, read_rows, recorded_format
from slotune.traces.replay import BLOCK_TOKENS, PlannedTrace, TraceReplay, plan_trace, rate_per_minute

__all__ = ["BLOCK_TOKENS", "PlannedTrace", "TraceFormat", "TraceReplay", "TraceRow", "detect_format", "plan_trace",
           "rate_per_minute", "read_rows", "recorded_format"]
