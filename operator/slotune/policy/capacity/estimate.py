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
FORGET_PER_WINDOW = 1.08  # a ceiling rises this much a steady window unless measured again: it doubles in nine
MIN_FACTOR, MAX_FACTOR = 0.05, 20.0  # the model is not trusted beyond 20x either way, nor is one window


class CapacityEstimate(BaseModel):
    """What the windows say about a config's per-replica capacity, as factors on the performance model's prior."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config_key: str
    met_factor: float | None = None  # the highest per-replica load / prior at which a steady window met the SLO
    missed_factor: float | None = None  # the lowest at which a steady window missed with a growing queue
    saturated_factor: float | None = None  # the lowest served rate / prior measured while the queue never emptied
    trim_missed_factor: float | None = None  # the lowest at which a window missed right after a trim (never ages)
    carried_factor: float = 1.0  # learned on the configs before this one: where this config's estimate starts

    @property
    def measured(self) -> bool:
        """Whether any window of this config bounded its capacity (else the estimate is the corrected prior)."""
        return any(f is not None for f in (self.met_factor, self.missed_factor, self.saturated_factor,
                                           self.trim_missed_factor))

    @property
    def factor(self) -> float:
        """Capacity / prior: the carried factor moved into [what met, what missed or saturated]."""
        ceilings = [f * MISSED_SHARE for f in (self.missed_factor, self.trim_missed_factor) if f is not None]
        ceilings += [f * SATURATED_SHARE for f in (self.saturated_factor,) if f is not None]
        value = min([self.carried_factor, *ceilings])
        if self.met_factor is not None:
            value = max(value, self.met_factor)
        return min(max(value, MIN_FACTOR), MAX_FACTOR)

    def met(self, load_factor: float) -> CapacityEstimate:
        best = load_factor if self.met_factor is None else max(self.met_factor, load_factor)
        # A miss measured below a load that met since was a burst inside the window, not the capacity.
        def above(factor: float | None) -> float | None:
            return factor if factor is None or factor > best else None

        return self.model_copy(update={"met_factor": best, "missed_factor": above(self.missed_factor),
                                       "trim_missed_factor": above(self.trim_missed_factor)})

    def missed(self, load_factor: float) -> CapacityEstimate:
        low = load_factor if self.missed_factor is None else min(self.missed_factor, load_factor)
        met = self.met_factor if self.met_factor is None or self.met_factor < low else None
        return self.model_copy(update={"missed_factor": low, "met_factor": met})

    def aged(self) -> CapacityEstimate:
        """One steady window later: the ceilings measured on the way up loosen. A miss or a saturated window bounds
        the capacity of its moment (one replica taking a burst, a run's first window serving requests still in
        flight), and a fleet several times larger multiplexes bursts that one replica cannot: kept for ever, such a
        ceiling would pin the estimate, and the replicas, to the worst window ever seen. Measured again, it stands
        again. A trim's miss does not age: trying its load again would cost another window of users (on an L4,
        where the model overrates a replica threefold, letting it age at half the pace cost 1.1 points of a day's
        attainment in the trace benchmark). A factor carried from the configs before rises back to the prior the
        same way, never past it: it was measured on another config, and one the search kept for serving more (a
        smaller token budget after long prefill chunks broke TPOT) would otherwise run at the old config's capacity
        for good, its gain never turned into fewer replicas."""
        def loosen(factor: float | None) -> float | None:
            return None if factor is None or factor * FORGET_PER_WINDOW > MAX_FACTOR else factor * FORGET_PER_WINDOW

        carried = self.carried_factor if self.carried_factor >= 1.0 else min(self.carried_factor * FORGET_PER_WINDOW,
                                                                             1.0)
        return self.model_copy(update={"missed_factor": loosen(self.missed_factor),
                                       "saturated_factor": loosen(self.saturated_factor), "carried_factor": carried})

    def trim_missed(self, load_factor: float) -> CapacityEstimate:
        """A window that missed right after a trim, at `load_factor` per replica: a ceiling that does not age."""
        low = load_factor if self.trim_missed_factor is None else min(self.trim_missed_factor, load_factor)
        return self.missed(load_factor).model_copy(update={"trim_missed_factor": low})

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
