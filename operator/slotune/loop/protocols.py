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
    in_progress: bool = False  # the change is made but does not serve yet: ask again (ok is False meanwhile)
    changed: bool = False  # this call changed what runs (a measurement window must start after it)

    @classmethod
    def success(cls, changed: bool = True) -> ApplyResult:
        return cls(True, changed=changed)

    @classmethod
    def failure(cls, reason: str, crashed: bool = True) -> ApplyResult:
        return cls(False, reason, crashed)

    @classmethod
    def rolling_out(cls, reason: str) -> ApplyResult:
        return cls(False, reason, in_progress=True, changed=True)


@dataclass(frozen=True)
class ReplicaCounts:
    """Replicas serving, and replicas ordered that do not serve yet (a backend that can tell the two apart has a
    `replica_counts()` method; capacity control reads it, see loop.capacity)."""

    ready: int
    starting: int = 0


def replica_counts(backend: object, running: RuntimeConfig) -> ReplicaCounts:
    """Ready and starting replicas, from a backend that tells them; else every replica of the config serves."""
    reader = getattr(backend, "replica_counts", None)
    return reader() if reader is not None else ReplicaCounts(ready=running.replicas, starting=0)


def retry_fit(backend: object, config: RuntimeConfig) -> str | None:
    """A backend that scaled `config`'s replicas down to what the cluster placed (a `retry_fit()` method:
    backends.kube_fit) asks for all of them again once its backoff is due: what it did, else None."""
    retry = getattr(backend, "retry_fit", None)
    return retry(config) if retry is not None else None


class WindowOpen(Exception):
    """The window to judge has not ended yet; step again at `ends_at_s` (unix seconds)."""

    def __init__(self, ends_at_s: float) -> None:
        super().__init__(f"window ends at {ends_at_s:.1f}")
        self.ends_at_s = ends_at_s


class Backend(Protocol):
    def apply(self, config: RuntimeConfig) -> ApplyResult:
        """Make the deployment run `config` (restart or hot reconfigure). Idempotent: asked again for the same config
        it reports progress, and asked for the config that already runs it checks every replica still runs it,
        repairing any that drifted (`changed` then says so). Returns ok once it serves, `rolling_out` while it is
        on its way, or why it does not serve."""
        ...

    def ready(self) -> bool:
        """Whether the deployment serves right now."""
        ...


class MeasurementSource(Protocol):
    def measure(self, window_s: float) -> MetricsSnapshot:
        """One window of measurements; raises MetricsUnavailable when there is none, WindowOpen while it lasts."""
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
