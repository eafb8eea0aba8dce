"""The trace benchmark's goal check (slotune.tracebench.goal): which baseline slotune's cost is compared with, and
when the report says the goal falls short."""

from __future__ import annotations

from slotune.tracebench.goal import check
from slotune.tracebench.metrics import PassFigures
from slotune.tracebench.run import StrategyFigures


def figures(strategy: str, engine: str, attainment: float, gpu_hours: float, variant: str = "") -> StrategyFigures:
    second = PassFigures(attainment=attainment, window_attainment=attainment, gpu_hours=gpu_hours,
                         changes_per_hour=0.0, worst_window=attainment)
    return StrategyFigures(strategy, engine, variant, "", second, second)


def test_cost_is_compared_with_the_cheapest_baseline_as_good_as_slotune() -> None:
    checked = check((figures("slotune", "tuned", 0.999, 1.4),
                     figures("static-peak", "default", 0.999, 3.0),
                     figures("queue-autoscaler", "default", 0.999, 2.0, "waiting/replica>0.5"),
                     figures("queue-autoscaler", "default", 0.90, 0.5, "waiting/replica>8"),  # cheaper, not as good
                     figures("static-peak", "oracle", 0.999, 1.4)))
    assert checked is not None
    default, oracle = checked.costs
    assert default.reference is not None and default.reference.variant == "waiting/replica>0.5"
    assert default.ratio == 0.7 and default.met
    assert oracle.ratio == 1.0 and oracle.met
    assert checked.met and checked.describe().startswith("Goal, pass 2: met.")


def test_short_on_attainment_or_cost_says_so_with_the_figures() -> None:
    checked = check((figures("slotune", "tuned", 0.9755, 6.64),
                     figures("static-peak", "default", 0.9952, 8.40),
                     figures("static-peak", "oracle", 0.9961, 7.47)))
    assert checked is not None and not checked.attainment_met and not checked.met
    text = checked.describe()
    assert "short" in text and "97.55%" in text and "99.61%" in text
    assert "static-peak, 8.40" in text  # the baseline the cost was compared with


def test_nothing_as_good_means_no_cost_comparison_and_no_shortfall_on_cost() -> None:
    checked = check((figures("slotune", "tuned", 0.995, 9.0), figures("static-peak", "default", 0.95, 2.0),
                     figures("static-peak", "oracle", 0.95, 2.0)))
    assert checked is not None and all(c.reference is None and c.met for c in checked.costs)
    assert "no default-settings baseline reaches that attainment" in checked.describe()
    assert check((figures("static-peak", "default", 0.95, 2.0),)) is None
