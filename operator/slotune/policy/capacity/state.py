"""Capacity control's memory, kept in the tuning state (and so in the status and across operator restarts)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from slotune.policy.capacity.estimate import CapacityEstimate
from slotune.policy.capacity.forecast import RateForecast

HOUR_S = 3600.0
MAX_STARTUPS = 4  # start-ups remembered: the plan uses the slowest of them


class ScaleStep(BaseModel):
    """A replica change capacity control ordered, and what the model predicted it would do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    at_s: float
    from_replicas: int
    to_replicas: int
    predicted_per_replica: float  # requests/s each replica was expected to serve within the SLO
    waiting_at_order: float  # the queue it was ordered into
    judged: bool = False
    served_at_s: float | None = None  # when every replica it ordered first served (its start-up, measured)

    @property
    def up(self) -> bool:
        return self.to_replicas > self.from_replicas


class CapacityState(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    forecast: RateForecast | None = None
    estimate: CapacityEstimate | None = None
    ordered: int = 0  # replicas ordered, ready or starting (0: not yet known)
    changes_at_s: tuple[float, ...] = ()  # when the changes of the last hour were ordered
    down_windows: int = 0  # consecutive windows in which fewer replicas would have sufficed
    trim_to: int = 0  # the most replicas any window of that streak asked for: where a trim goes
    trim_bar: float = 1.0  # raised by each failed trim (settings.trim_bar_step)
    last_step: ScaleStep | None = None
    startups_s: tuple[float, ...] = ()  # measured start-ups, order to serving, newest last
    infeasible_at_rate: bool = False  # the load needs more replicas than maxReplicas
    queued_at_s: float | None = None  # the end of the last window in which requests queued
    message: str = ""
    # The last window as the plan read it, for the status.
    ready: int = 0
    starting: int = 0
    arrival_per_s: float = 0.0
    waiting_end: float = 0.0  # requests queued at its end, all replicas together
    forecast_per_s: float = 0.0  # the upper forecast a start-up plus a window ahead
    per_replica_per_s: float = 0.0  # the estimated SLO-meeting rate of one replica

    def startup_s(self, prior_s: float) -> float:
        return max(self.startups_s) if self.startups_s else prior_s

    def changes_in_hour(self, now_s: float) -> int:
        return sum(1 for t in self.changes_at_s if now_s - t < HOUR_S)

    def with_startup(self, startup_s: float) -> CapacityState:
        return self.model_copy(update={"startups_s": (*self.startups_s, startup_s)[-MAX_STARTUPS:]})
