"""The issue's goal for one trace and pair, checked on the second pass: slotune's request attainment at least
ATTAINMENT_GOAL and at least every baseline's; its GPU-hours at most DEFAULT_COST_GOAL x the cheapest baseline on
default engine settings, and at most ORACLE_COST_GOAL x the cheapest on the oracle's, among the baselines that reach
slotune's attainment (or the goal's, if lower). The report prints where it falls short, with the figures.

Beside each cost goal stands what foresight pays (`hindsight`): the cheapest pool sized with the arrivals known ahead,
either the static pool (sized for the known peak) or the hindsight pool (each window's arrivals known, replicas
serving at once), among those reaching the attainment the goal asks of slotune. It is no bound (`hindsight`), but a
goal below that ratio asks slotune to beat foresight on that engine config; the report says so."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slotune.tracebench.hindsight import HindsightPool
from slotune.tracebench.metrics import StrategyFigures

ATTAINMENT_GOAL = 0.99
DEFAULT_COST_GOAL = 0.7
ORACLE_COST_GOAL = 1.05


@dataclass(frozen=True)
class CostCheck:
    engine_config: str  # the baselines' engine config: default or oracle
    goal: float  # slotune's GPU-hours / the reference's, at most
    reference: StrategyFigures | None  # the cheapest baseline reaching the bar; None: none reached it
    ratio: float | None
    foresight: float | None = None  # GPU-h of the cheapest pool sized with foresight / the reference's (None: none)

    @property
    def beyond_foresight(self) -> bool:
        return self.foresight is not None and self.foresight > self.goal

    @property
    def met(self) -> bool:
        # No baseline reaching slotune's attainment: slotune costs less than anything as good.
        return self.ratio is None or self.ratio <= self.goal


@dataclass(frozen=True)
class GoalCheck:
    attainment: float
    best_baseline_attainment: float
    costs: tuple[CostCheck, ...]

    @property
    def attainment_met(self) -> bool:
        return self.attainment >= ATTAINMENT_GOAL and self.attainment >= self.best_baseline_attainment

    @property
    def met(self) -> bool:
        return self.attainment_met and all(c.met for c in self.costs)

    def describe(self) -> str:
        parts = [f"attainment {self.attainment:.2%} (goal >= {ATTAINMENT_GOAL:.0%} and >= the best baseline's "
                 f"{self.best_baseline_attainment:.2%}: {'met' if self.attainment_met else 'short'})"]
        for cost in self.costs:
            if cost.reference is None:
                parts.append(f"no {cost.engine_config}-settings baseline reaches that attainment")
                continue
            ref = cost.reference
            name = f"{ref.strategy}{' ' + ref.variant if ref.variant else ''}"
            seen = "" if cost.foresight is None else f"; foresight pays {cost.foresight:.2f}x" + (
                ", above the goal" if cost.beyond_foresight else "")
            parts.append(f"GPU-h {cost.ratio:.2f}x the cheapest {cost.engine_config}-settings baseline as good "
                         f"({name}, {ref.second.gpu_hours:.2f}; goal <= {cost.goal}x: "
                         f"{'met' if cost.met else 'short'}{seen})")
        return f"Goal, pass 2: {'met' if self.met else 'short'}. " + "; ".join(parts) + "."


def required_attainment(figures: tuple[StrategyFigures, ...]) -> float:
    """The second-pass attainment the goal asks of slotune: ATTAINMENT_GOAL, and every baseline's."""
    return max([ATTAINMENT_GOAL, *(f.second.attainment for f in figures if f.strategy != "slotune")])


def check(figures: tuple[StrategyFigures, ...],
          hindsight: Mapping[str, HindsightPool] | None = None) -> GoalCheck | None:
    """None when slotune did not run in this case."""
    ours = next((f for f in figures if f.strategy == "slotune"), None)
    if ours is None:
        return None
    baselines = [f for f in figures if f.strategy != "slotune"]
    bar = min(ours.second.attainment, ATTAINMENT_GOAL)
    costs = []
    for engine, goal in (("default", DEFAULT_COST_GOAL), ("oracle", ORACLE_COST_GOAL)):
        good = [f for f in baselines if f.engine_config == engine and f.second.attainment >= bar]
        reference = min(good, key=lambda f: f.second.gpu_hours, default=None)
        ratio = None if reference is None else ours.second.gpu_hours / max(reference.second.gpu_hours, 1e-9)
        foresight = _foresight_hours(figures, (hindsight or {}).get(engine), engine)
        seen = None if reference is None or foresight is None else foresight / max(reference.second.gpu_hours, 1e-9)
        costs.append(CostCheck(engine, goal, reference, ratio, seen))
    best = max((f.second.attainment for f in baselines), default=0.0)
    return GoalCheck(ours.second.attainment, best, tuple(costs))


def _foresight_hours(figures: tuple[StrategyFigures, ...], pool: HindsightPool | None, engine: str) -> float | None:
    """GPU-h of the cheapest pool sized with foresight (static-peak, the hindsight pool) that reaches the attainment
    the goal asks of slotune on `engine`; None when neither does (or the hindsight pool was not run)."""
    if pool is None:
        return None
    bar = required_attainment(figures)
    hours = [f.second.gpu_hours for f in figures
             if f.strategy == "static-peak" and f.engine_config == engine and f.second.attainment >= bar]
    hours += [pool.figures.gpu_hours] if pool.reached else []
    return min(hours, default=None)
