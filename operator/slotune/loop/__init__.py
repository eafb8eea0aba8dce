"""The tuning state machine both the operator and local mode drive: state, the protocols backends implement, tuner
(its steps: apply, measure, converge, verify, reopen; see loop.tuner)."""

from slotune.loop.problem import TuningProblem
from slotune.loop.protocols import (
    ApplyResult,
    Backend,
    FileStateStore,
    MeasurementSource,
    MemoryStateStore,
    MetricsUnavailable,
    StateStore,
    WindowOpen,
)
from slotune.loop.state import HistoryRecord, InfeasibleReport, PendingChange, TuningState
from slotune.loop.tuner import Tuner

__all__ = [
    "ApplyResult",
    "Backend",
    "FileStateStore",
    "HistoryRecord",
    "InfeasibleReport",
    "MeasurementSource",
    "MemoryStateStore",
    "MetricsUnavailable",
    "PendingChange",
    "StateStore",
    "Tuner",
    "TuningProblem",
    "TuningState",
    "WindowOpen",
]
