"""Scoring one configuration of a scenario: simulate it on windows of its traffic, cache them, derive goodput.

A configuration is scored on SCORED_WINDOWS windows of the workload (seeds seed, seed + 1, ...): it meets the SLO only
if every one of them does, since a config that holds on one burst pattern and not the next would not hold in
production either (and a tuner measuring live windows would see it flap). Later windows of a running config (the
loop's confirmation and re-measurement windows) are fresh traffic too, simulated on demand.
A config that meets the SLO also `holds` when it does on the LATER_WINDOWS windows after the scored ones and on
FRESH_SEEDS further windows no strategy ever measures (seeds past FRESH_SEED_OFFSET, drawn per scenario): the oracle
is the best config that holds, so that it is not one that met a few windows by luck at the SLO's edge; slotune's
final config is checked on the same fresh windows.
Goodput follows DistServe (Zhong et al., OSDI'24) and docs/facts.md#traffic: the share of requests meeting every latency
target (at the loosest declared percentile's bound) times the offered request rate, averaged over the scored
windows, per replica, and zero unless the SLO holds (the declared percentiles and throughput floor). Per replica, so
replicas the load does not need lower it, as they raise the bill; per offered request, so finishing a backlog sooner
does not count.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.roofline import Efficiency
from slotune.policy.worst_miss import badness
from slotune.simulator.cluster import SimulationResult, simulate
from slotune.simulator.replica import SimulatedRequest
from slotune.simulator.window import tpot_ms
from slotune.slo import SLOSpec
from slotune.snapshot import MetricsSnapshot
from slotune.tunerbench.scenario import Scenario
from slotune.workload import plan_requests

SCORED_WINDOWS = 2
LATER_WINDOWS = 4  # windows after the scored ones a config must also meet to hold (the oracle's bar)
FRESH_SEEDS = 3
FRESH_SEED_OFFSET = 10_000  # far past any window a strategy measures


@dataclass(frozen=True)
class Evaluation:
    config: RuntimeConfig
    starts: bool  # False: the runtime would not start (out of memory)
    met: bool
    goodput_per_replica: float  # requests/s per replica meeting every target; 0 unless the window meets the SLO
    badness: float  # worst observed/target ratio, inf when it does not start
    snapshot: MetricsSnapshot | None

    @property
    def score(self) -> float:
        """One number for search baselines: met configs rank by goodput above every unmet one."""
        if not self.starts:
            return -1e9
        return 1.0 + self.goodput_per_replica if self.met else -math.log(max(self.badness, 1.0))


class Evaluator:
    """Scores configurations on the scenario's final traffic (after any shift); `phases` serve the windows measured
    on each workload the run goes through (the last is this evaluator)."""

    def __init__(self, scenario: Scenario) -> None:
        phases = scenario.phases
        self.phases: tuple[tuple[int, Evaluator], ...] = (
            *((start, Evaluator(s)) for start, s in phases[:-1]), (phases[-1][0], self))
        self.after_windows = phases[-1][0]  # measured windows before the final workload (0: it never shifts)
        scenario = scenario.final
        self.scenario = scenario
        self.deployment = scenario.deployment  # what the tuner is told
        self.simulated = scenario.simulated_deployment  # what the simulator plays (see HardwareSkew)
        first = plan_requests(scenario.workload, num_requests=scenario.requests_per_window, seed=scenario.seed)
        span_s = max(first[-1].arrival_s - first[0].arrival_s, 1e-9) if first else 1.0
        self.offered_rate_per_s = scenario.workload.request_rate_per_s or len(first) / span_s
        self._cache: dict[str, Evaluation] = {}
        self._windows: dict[tuple[str, int, float], SimulationResult] = {}

    @property
    def num_evaluated(self) -> int:
        return len(self._cache)

    def evaluate(self, config: RuntimeConfig) -> Evaluation:
        key = config.key()
        if key not in self._cache:
            self._cache[key] = self._run(config)
        return self._cache[key]

    def holds(self, config: RuntimeConfig) -> bool:
        """Meets the SLO on the scored windows, the LATER_WINDOWS after them and every fresh one (FRESH_SEEDS): what
        the oracle and feasibility require (a config at the SLO's edge met 5 windows and missed 2 of the 4 after
        its scored ones). Simulated only for a config that met the scored windows."""
        if not self.evaluate(config).met:
            return False
        later = (self.window(config, i) for i in range(SCORED_WINDOWS, SCORED_WINDOWS + LATER_WINDOWS))
        return all(w is not None and self.scenario.slo.is_met(w) for w in later) and \
            self.meets_fresh(config) == FRESH_SEEDS

    def meets_fresh(self, config: RuntimeConfig, seeds: int = FRESH_SEEDS) -> int:
        """On how many of `seeds` windows of traffic no strategy measured (seeds from FRESH_SEED_OFFSET on) the
        config meets the SLO: whether it holds beyond the windows it was chosen on."""
        found = (self.window(config, self.fresh_index(i)) for i in range(seeds))
        return sum(w is not None and self.scenario.slo.is_met(w) for w in found)

    def fresh_index(self, i: int) -> int:
        """The i-th fresh window's index, past FRESH_SEED_OFFSET and drawn per scenario: the same three seeds in every
        scenario would be the same three draws of the arrival and length quantiles everywhere (one of them held a
        prompt 7x the median in every scenario), so their verdicts were not independent samples."""
        return FRESH_SEED_OFFSET + (zlib.crc32(self.scenario.name.encode()) % 100_000) * FRESH_SEEDS + i

    @property
    def shifts(self) -> bool:
        return len(self.phases) > 1

    def traffic(self, window: int) -> tuple[int, Evaluator]:
        """The phase (its position, its evaluator) serving the window-th measured window (counted from 1)."""
        i = max(i for i, (start, _) in enumerate(self.phases) if window > start or i == 0)
        return i, self.phases[i][1]

    def window(self, config: RuntimeConfig, index: int, speed: float = 1.0) -> MetricsSnapshot | None:
        """The index-th window of traffic a running config serves (seed + index) on a machine running at `speed`
        times its usual pace; None if it cannot start."""
        if self.simulated.startup_error(config) is not None:
            return None
        return self._simulate(config, index, speed).snapshot

    def _simulate(self, config: RuntimeConfig, index: int, speed: float = 1.0) -> SimulationResult:
        key = (config.key(), index, speed)
        if key not in self._windows:
            requests = plan_requests(self.scenario.workload, num_requests=self.scenario.requests_per_window,
                                     seed=self.scenario.seed + index)
            deployment = self.simulated
            if speed != 1.0:
                efficiency = deployment.efficiency or Efficiency.prior(deployment.accelerator)
                deployment = replace(deployment, efficiency=efficiency.slower(1.0 / speed))
            self._windows[key] = simulate(deployment, config, requests, self.scenario.spec_acceptance_rate)
        return self._windows[key]

    def _run(self, config: RuntimeConfig) -> Evaluation:
        if self.simulated.startup_error(config) is not None:
            return Evaluation(config, False, False, 0.0, math.inf, None)
        slo = self.scenario.slo
        results = [self._simulate(config, index) for index in range(SCORED_WINDOWS)]
        met = all(slo.is_met(r.snapshot) for r in results)
        planned = self.scenario.requests_per_window  # requests that failed or never finished count as missed
        shares = [sum(_meets(record, slo) for record in r.records) / planned for r in results]
        good = sum(shares) / len(shares) * self.offered_rate_per_s / config.replicas
        worst = max(badness(slo, r.snapshot) for r in results)
        return Evaluation(config, True, met, good if met else 0.0, worst, results[0].snapshot)


def _meets(record: SimulatedRequest, slo: SLOSpec) -> bool:
    ttft = (record.first_token_s - record.arrival_s) * 1000.0
    e2e = (record.finish_s - record.arrival_s) * 1000.0
    tpot = tpot_ms(record) if record.output_tokens > 1 else 0.0
    return all(value <= bound for value, bound in ((ttft, _loosest(slo.ttft)), (tpot, _loosest(slo.tpot)),
                                                   (e2e, _loosest(slo.e2e))))


def _loosest(targets: object) -> float:
    if targets is None:
        return math.inf
    values = [v for v in (targets.p50, targets.p95, targets.p99) if v is not None]  # type: ignore[attr-defined]
    return max(values)
