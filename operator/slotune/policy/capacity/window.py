"""What capacity control reads from one window, and what it keeps of the replicas it ordered."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CapacityWindow:
    """One window as capacity control sees it: the load that arrived, what was served, the queue, the replicas.

    `prior_per_replica` is the performance model's SLO-meeting requests/s for one replica of the running config at
    this window's request lengths (`perfmodel.capacity`); the estimate corrects it by what windows measured.
    """

    end_s: float
    window_s: float
    arrival_rate_per_s: float
    served_rate_per_s: float
    waiting_end: float  # requests queued at the window's end, all replicas together
    waiting_mean: float  # requests queued on average over the window, all replicas together
    ready: int  # replicas that served through the window
    starting: int  # replicas ordered and not serving yet
    met: bool  # every SLO target held in this window
    prior_per_replica: float

    @property
    def steady(self) -> bool:
        """Nothing started during the window: what it measured is the capacity of `ready` replicas."""
        return self.starting == 0 and self.ready > 0

    @property
    def saturated(self) -> bool:
        """The queue never emptied: every replica served as fast as it could, so the served rate is its capacity."""
        return self.ready > 0 and self.waiting_mean >= self.ready and self.waiting_end >= self.ready

    def load_factor(self) -> float:
        """Per-replica arrivals as a multiple of the model's capacity."""
        return self.arrival_rate_per_s / max(self.ready, 1) / max(self.prior_per_replica, 1e-9)

    def served_factor(self) -> float:
        return self.served_rate_per_s / max(self.ready, 1) / max(self.prior_per_replica, 1e-9)
