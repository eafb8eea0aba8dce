"""Run every strategy on one scenario and score it against the exhaustive oracle.

The oracle is the best configuration over the whole search space plus every configuration any strategy applied
(slotune can step off the sweep's ladders) that holds (meets the SLO on the scored windows and on the fresh ones no
strategy measures); a scenario is infeasible when none of them holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotune.knobs import RuntimeConfig
from slotune.tunerbench.evaluator import Evaluation, Evaluator
from slotune.tunerbench.honesty import Honesty, above_oracle, judge
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
    evidence: str | None = None  # the model's first verdict that nothing allowed can meet the SLO (slotune only)
    changes_at_evidence: int | None = None  # configs applied by the window that carried it
    honesty: Honesty | None = None  # its decisions judged noise-free (slotune only: tunerbench.honesty)
    above_oracle: str = ""  # resting on more replicas than the oracle: what each would do (honesty.above_oracle)

    @property
    def changes_after_evidence(self) -> int | None:
        """Configs applied after the window whose evidence sufficed until Infeasible was said; None when it was said
        with no such window before it (the remedies left were tried: the verdict is its own evidence)."""
        if self.changes_to_infeasible is None or self.changes_at_evidence is None:
            return None
        return max(0, self.changes_to_infeasible - self.changes_at_evidence)

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
    space_size: int = 0  # configurations in the search space (space.all_configs)
    space_met: int = 0  # of them, how many meet the SLO on the scored windows: what a uniform sample hits
    oracle_gpus: int = 0  # the oracle config's replicas x GPUs per replica

    @property
    def slotune(self) -> StrategyResult | None:
        return next((x for x in self.results if x.strategy == "slotune"), None)


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
    space = all_configs(scenario)
    candidates = space + [e.config for t in traces for e in t.applied]
    ranked = sorted((evaluator.evaluate(c) for c in candidates), key=lambda e: e.score, reverse=True)
    oracle = next((e for e in ranked if e.met and evaluator.holds(e.config)), ranked[0])  # best first: few checked
    feasible = evaluator.holds(oracle.config)
    start = evaluator.evaluate(scenario.start)
    results = tuple(_score(t, evaluator, oracle, feasible, start) for t in traces)
    fewest = min((len(scenario.start.changed_knobs(c)) for c in candidates if evaluator.evaluate(c).met), default=None)
    return ScenarioResult(scenario.name, feasible, oracle.goodput_per_replica, oracle.config.describe(), start.met,
                          evaluator.num_evaluated, results, fewest, len(space),
                          sum(evaluator.evaluate(c).met for c in space),
                          oracle.config.replicas * scenario.tensor_parallel)


def random_search_expected(size: int, met: int, budget: int) -> list[float]:
    """P(T = k) for k = 1..budget + 1 (budget + 1: never) where T is the configs a uniform sample without replacement
    of a space of `size` with `met` SLO-meeting configs needs until the first of them: the exact expectation of the
    random baseline, free of its seeds' luck. P(T > k) = prod_{j<k} (size - met - j) / (size - j)."""
    probabilities, beyond = [], 1.0
    for k in range(budget):
        after = beyond * max(size - met - k, 0) / (size - k) if size > k else 0.0
        probabilities.append(beyond - after)
        beyond = after
    return [*probabilities, beyond]


def _score(trace: Trace, evaluator: Evaluator, oracle: Evaluation, feasible: bool,
           start: Evaluation) -> StrategyResult:
    # One rule for every strategy: configurations applied after the start until the first that meets the SLO on the
    # scored windows (0 when the start already does); a config applied again (a rollback) is not a new one.
    to_slo = 0 if start.met else next((i + 1 for i, e in enumerate(trace.applied) if e.met), None)
    final: RuntimeConfig | None = trace.final
    ratio = None
    if feasible and oracle.goodput_per_replica > 0:
        goodput = evaluator.evaluate(final).goodput_per_replica if final is not None else 0.0
        ratio = goodput / oracle.goodput_per_replica
    best, curve = (start.goodput_per_replica if trace.strategy == "slotune" else 0.0), []
    for evaluation in trace.applied:
        best = max(best, evaluation.goodput_per_replica)
        curve.append(best / oracle.goodput_per_replica if feasible and oracle.goodput_per_replica > 0 else 0.0)
    is_slotune = trace.strategy == "slotune"
    fresh = evaluator.meets_fresh(final) if final is not None and feasible and is_slotune else None
    honesty = judge(trace, evaluator, evaluator.scenario.tensor_parallel) if is_slotune else None
    above = above_oracle(evaluator, final, oracle.config) if is_slotune and final is not None else ""
    return StrategyResult(trace.strategy, to_slo, ratio, trace.regressions, trace.declared_infeasible, tuple(curve),
                          final.describe() if final is not None else "-", fresh, trace.changes_to_infeasible,
                          trace.evidence, trace.changes_at_evidence, honesty, above)
