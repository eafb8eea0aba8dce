"""What the tuning loop needs from the outside world: a backend that runs configs, a measurement source, a store.

The Kubernetes operator and local mode each implement these; the simulator implements the first two for tests and
the tuner benchmark. Failures are values (`ApplyResult`) or one exception (`MetricsUnavailable`), so the loop's
fault handling is explicit: metrics unavailable -> keep the config and report; apply failure -> roll back, blacklist.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from slotune.knobs import RuntimeConfig
from slotune.loop.state import TuningState
from slotune.metrics.window import MetricsUnavailable  # noqa: F401  (re-exported: one exception for every source)
from slotune.snapshot import MetricsSnapshot


@dataclass(frozen=True)
class ApplyResult:
    ok: bool
    reason: str = ""
    crashed: bool = False  # the runtime died or never became ready under the config

    @classmethod
    def success(cls) -> ApplyResult:
        return cls(True)

    @classmethod
    def failure(cls, reason: str, crashed: bool = True) -> ApplyResult:
        return cls(False, reason, crashed)


class Backend(Protocol):
    def apply(self, config: RuntimeConfig) -> ApplyResult:
        """Run `config` (restart or hot reconfigure) and return once it serves, or why it does not."""
        ...

    def ready(self) -> bool:
        """Whether the deployment serves right now."""
        ...


class MeasurementSource(Protocol):
    def measure(self, window_s: float) -> MetricsSnapshot:
        """One window of measurements; raises MetricsUnavailable when there is none."""
        ...


class StateStore(Protocol):
    def load(self) -> TuningState | None: ...

    def save(self, state: TuningState) -> None: ...


class MemoryStateStore:
    """Keeps the state in memory, as its JSON, so a resumed tuner sees exactly what a restarted process would."""

    def __init__(self) -> None:
        self._text: str | None = None

    def load(self) -> TuningState | None:
        return None if self._text is None else TuningState.from_json(self._text)

    def save(self, state: TuningState) -> None:
        self._text = state.to_json()


class FileStateStore:
    """Local mode: the state in a JSON file, replaced atomically so a crash never leaves half a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> TuningState | None:
        return TuningState.from_json(self.path.read_text()) if self.path.exists() else None

    def save(self, state: TuningState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(self.path.suffix + ".tmp")
        partial.write_text(state.to_json())
        partial.replace(self.path)
