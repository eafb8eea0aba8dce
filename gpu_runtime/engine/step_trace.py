"""Opt-in per-step trace: one JSON line per engine step with the step's shape and its wall time.

Off by default. With the environment variable GPU_RUNTIME_STEP_TRACE=PATH the engine appends, after each step, the
fields of `StepRecord`: start and end (monotonic seconds), prefill tokens and sequences, prefill attention tokens as
the performance model counts them (a chunk of c tokens after p computed ones attends c * (p + c / 2) positions), the
c * p of them whose key is earlier context read from the paged cache, new sequences (whose first chunk runs: a
request's first step), decoding sequences and their context tokens. The operator's performance model calibrates its
step-time coefficients against these lines (slotune.perfmodel.calibration). Pure Python; the cost is one short line
write per step.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import TextIO

from gpu_runtime.engine.scheduler import SchedulerOutput

STEP_TRACE_ENV = "GPU_RUNTIME_STEP_TRACE"


@dataclass(frozen=True)
class StepRecord:
    start_s: float
    end_s: float
    num_prefill_tokens: int
    num_prefill_seqs: int
    prefill_attention_tokens: float
    prefill_context_pairs: int
    num_new_seqs: int
    num_decode_seqs: int
    decode_context_tokens: int
    max_decode_context_tokens: int


def step_record(sched: SchedulerOutput, start_s: float, end_s: float) -> StepRecord:
    """The shape of one scheduled step: a decode computes one generated token (plus drafts), anything else is a
    prefill chunk (a prompt, or a preempted sequence's recompute)."""
    prefill_tokens = prefill_seqs = context_pairs = new_seqs = decode_seqs = decode_context = max_context = 0
    attention = 0.0
    for item in sched.scheduled:
        query = item.num_new_tokens - item.num_spec_tokens
        if query == 1 and item.start >= item.seq.num_prompt_tokens:
            decode_seqs += 1
            context = item.start + item.num_new_tokens
            decode_context += context
            max_context = max(max_context, context)
        else:
            prefill_seqs += 1
            prefill_tokens += item.num_new_tokens
            attention += item.num_new_tokens * (item.start + item.num_new_tokens / 2)
            context_pairs += item.num_new_tokens * item.start
            new_seqs += item.start == item.seq.num_cached_tokens  # nothing computed past the cache hit yet
    return StepRecord(start_s, end_s, prefill_tokens, prefill_seqs, attention, context_pairs, new_seqs,
                      decode_seqs, decode_context, max_context)


class StepTrace:
    """Appends StepRecords as JSON lines to one file (line-buffered, so a killed process loses at most one line)."""

    def __init__(self, path: str) -> None:
        self._file: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the engine

    @classmethod
    def from_env(cls) -> StepTrace | None:
        path = os.environ.get(STEP_TRACE_ENV)
        return cls(path) if path else None

    def record(self, sched: SchedulerOutput, start_s: float, end_s: float) -> None:
        if sched.scheduled:
            self._file.write(json.dumps(asdict(step_record(sched, start_s, end_s))) + "\n")
