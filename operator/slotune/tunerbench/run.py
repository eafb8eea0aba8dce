"""Run every strategy on one scenario and score it against the exhaustive oracle.

The oracle is the best configuration over the whole search space plus every configuration any strategy applied
(slotune can step off the sweep's ladders); a scenario is infeasible when none of them meets the SLO.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotune.knobs import RuntimeConfig
from slotune.tunerbench.evaluator import Evaluation, Evaluator
from slotune.tunerbench.scenario import Scenario
from slotune.tunerbench.space import all_configs
from slotune.tunerbench.strategies import STRATEGIES, Trace


@dataclass(frozen=True)
class StrategyResult:
    strategy: str
    configs_to_slo: int | None  # applied configurations until one met the SLO; None: never within budget
    final_goodput_ratio: float | None  # final config's goodput / oracle's; None on infeasible scenarios
    regressions: int
    declared_infeasible: bool
    best_so_far: tuple[float, ...]  # best goodput / oracle after each applied configuration
    final_config: str
    fresh_met: int | None = None  # of FRESH_SEEDS windows no strategy measured, how many the final config meets
    changes_to_infeasible: int | None = None  # configs applied before it first said Infeasible (slotune only)

    @property
    def configs_to_near_oracle(self) -> int | None:
        """Applied configurations until one reached NEAR_ORACLE of the oracle's goodput; None: never."""
        return next((i + 1 for i, best in enumerate(self.best_so_far) if best >= NEAR_ORACLE), None)


@dataclass(frozen=True)
class ScenarioResult:
    scenario: str
    feasible: bool
    oracle_goodput_per_replica: float
    oracle_config: str
    start_met: bool
    num_configs_evaluated: int
    results: tuple[StrategyResult, ...]
    # Fewest RuntimeConfig fields that differ between the start and any SLO-meeting configuration evaluated: what a
    # strategy changing one knob per step needs at least (a change may set two fields: chunked prefill + budget).
    fewest_fields_to_slo: int | None = None


NEAR_ORACLE = 0.95
SEEDED = ("random", "tpe")  # stochastic baselines run once per seed; their results pool across seeds


def run_scenario(scenario: Scenario, budget: int, strategies: tuple[str, ...] = tuple(STRATEGIES),
                 seeds: int = 5) -> ScenarioResult:
    evaluator = Evaluator(scenario)
    traces = []
    for name in strategies:
        if name in SEEDED:
            traces += [STRATEGIES[name](evaluator, budget, seed) for seed in range(seeds)]  # type: ignore[call-arg]
        else:
            traces.append(STRATEGIES[name](evaluator, budget))
    candidates = all_configs(scenario) + [e.config for t in traces for e in t.applied]
    oracle = max((evaluator.evaluate(c) for c in candidates), key=lambda e: e.score)
    feasible = oracle.met
    start = evaluator.evaluate(scenario.start)
    results = tuple(_score(t, evaluator, oracle, feasible, start) for t in traces)
    fewest = min((len(scenario.start.changed_knobs(c)) for c in candidates if evaluator.evaluate(c).met), default=None)
    return ScenarioResult(scenario.name, feasible, oracle.goodput_per_replica, oracle.config.describe(), start.met,
                          evaluator.num_evaluated, results, fewest)


def _score(trace: Trace, evaluator: Evaluator, oracle: Evaluation, feasible: bool,
           start: Evaluation) -> StrategyResult:
    to_slo = 0 if start.met and trace.strategy == "slotune" else next(
        (i + 1 for i, e in enumerate(trace.applied) if e.met), None)
    final: RuntimeConfig | None = trace.final
    ratio = None
    if feasible and oracle.goodput_per_replica > 0:
        goodput = evaluator.evaluate(final).goodput_per_replica if final is not None else 0.0
        ratio = goodput / oracle.goodput_per_replica
    best, curve = (start.goodput_per_replica if trace.strategy == "slotune" else 0.0), []
    for evaluation in trace.applied:
        best = max(best, evaluation.goodput_per_replica)
        curve.append(best / oracle.goodput_per_replica if feasible and oracle.goodput_per_replica > 0 else 0.0)
    fresh = evaluator.meets_fresh(final) if final is not None and feasible and trace.strategy == "slotune" else None
    return StrategyResult(trace.strategy, to_slo, ratio, trace.regressions, trace.declared_infeasible, tuple(curve),
                          final.describe() if final is not None else "-", fresh, trace.changes_to_infeasible)
