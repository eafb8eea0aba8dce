"""How many requests per second one replica of a config serves within the SLO: the performance model's prior,
corrected by what the windows measured.

A replica's SLO-meeting capacity depends on the config and on the request lengths of the moment, so what is learned
is a factor on the prior (`perfmodel.capacity`: the load at TARGET_UTILIZATION for the window's own lengths), not a
rate: a window that met the SLO at a per-replica load of `u` times the prior shows the factor is at least `u`; a
steady window that missed with its queue growing shows it is below `u`; a window whose queue never emptied served
at the most a replica can, and the SLO needs some room under that (`SATURATED_SHARE`). The estimate is the prior's
factor (1.0) moved into the measured bounds. A config change keeps the factor learned on the config before it
(the model errs alike for neighbouring configs) but marks it as not measured for the new one, and every verdict that
leans on it says which it is: a prior never decides a verdict alone.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

SATURATED_SHARE = 0.85  # of the most a replica serves: queueing delay grows as 1 / (1 - rho) past this
MISSED_SHARE = 0.95  # just under a per-replica load measured to miss, for the next plan
MIN_FACTOR, MAX_FACTOR = 0.05, 20.0  # the model is not trusted beyond 20x either way, nor is one window


class CapacityEstimate(BaseModel):
    """What the windows say about a config's per-replica capacity, as factors on the performance model's prior."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config_key: str
    met_factor: float | None = None  # the highest per-replica load / prior at which a steady window met the SLO
    missed_factor: float | None = None  # the lowest at which a steady window missed with a growing queue
    saturated_factor: float | None = None  # the lowest served rate / prior measured while the queue never emptied
    carried_factor: float = 1.0  # learned on the configs before this one: where this config's estimate starts

    @property
    def measured(self) -> bool:
        """Whether any window of this config bounded its capacity (else the estimate is the corrected prior)."""
        return any(f is not None for f in (self.met_factor, self.missed_factor, self.saturated_factor))

    @property
    def factor(self) -> float:
        """Capacity / prior: the carried factor moved into [what met, what missed or saturated]."""
        ceilings = [f * MISSED_SHARE for f in (self.missed_factor,) if f is not None]
        ceilings += [f * SATURATED_SHARE for f in (self.saturated_factor,) if f is not None]
        value = min([self.carried_factor, *ceilings])
        if self.met_factor is not None:
            value = max(value, self.met_factor)
        return min(max(value, MIN_FACTOR), MAX_FACTOR)

    def met(self, load_factor: float) -> CapacityEstimate:
        best = load_factor if self.met_factor is None else max(self.met_factor, load_factor)
        # A miss measured below a load that met since was a burst inside the window, not the capacity.
        missed = self.missed_factor if self.missed_factor is None or self.missed_factor > best else None
        return self.model_copy(update={"met_factor": best, "missed_factor": missed})

    def missed(self, load_factor: float) -> CapacityEstimate:
        low = load_factor if self.missed_factor is None else min(self.missed_factor, load_factor)
        met = self.met_factor if self.met_factor is None or self.met_factor < low else None
        return self.model_copy(update={"missed_factor": low, "met_factor": met})

    def saturated(self, served_factor: float) -> CapacityEstimate:
        low = served_factor if self.saturated_factor is None else min(self.saturated_factor, served_factor)
        return self.model_copy(update={"saturated_factor": low})

    def for_config(self, config_key: str) -> CapacityEstimate:
        """The estimate a new config starts from: this one's factor, carried, nothing measured yet."""
        if config_key == self.config_key:
            return self
        return CapacityEstimate(config_key=config_key, carried_factor=self.factor)

    def describe(self) -> str:
        carried = "prior" if self.carried_factor == 1.0 else "carried from the last config"
        how = "measured" if self.measured else carried
        return f"x{self.factor:.2f} the model's capacity ({how})"
