"""Scoring one configuration of a scenario: simulate the replayed window once, cache it, derive goodput.

Goodput follows DistServe (Zhong et al., OSDI'24) and reference.md s.6: a request counts when it meets every latency
target (at the loosest declared percentile's bound), and a configuration has goodput only if its window meets the SLO
(the declared percentiles and throughput floor). It is divided by replicas: per-accelerator goodput, so adding
replicas the load does not need lowers the score, as it raises the bill. The rate is over the replayed window's
arrival span, the same for every configuration, so finishing the backlog sooner does not count as goodput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slotune.knobs import RuntimeConfig
from slotune.loadgen.workload import plan_requests
from slotune.loop.tuner import badness
from slotune.metrics.snapshot import MetricsSnapshot
from slotune.simulator.cluster import simulate
from slotune.simulator.replica import RequestRecord
from slotune.simulator.window import tpot_ms
from slotune.slo import SLOSpec
from slotune.tunerbench.scenario import Scenario


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
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.deployment = scenario.deployment  # what the tuner is told
        self.simulated = scenario.simulated_deployment  # what the simulator plays (see HardwareSkew)
        self.requests = plan_requests(scenario.workload, num_requests=scenario.requests_per_window,
                                      seed=scenario.seed)
        self.span_s = max(self.requests[-1].arrival_s - self.requests[0].arrival_s, 1e-9) if self.requests else 1.0
        self._cache: dict[str, Evaluation] = {}

    @property
    def num_evaluated(self) -> int:
        return len(self._cache)

    def evaluate(self, config: RuntimeConfig) -> Evaluation:
        key = config.key()
        if key not in self._cache:
            self._cache[key] = self._run(config)
        return self._cache[key]

    def _run(self, config: RuntimeConfig) -> Evaluation:
        if self.simulated.startup_error(config) is not None:
            return Evaluation(config, False, False, 0.0, math.inf, None)
        result = simulate(self.simulated, config, self.requests, self.scenario.spec_acceptance_rate)
        slo = self.scenario.slo
        met = slo.is_met(result.snapshot)
        good = sum(_meets(r, slo) for r in result.records) / self.span_s / config.replicas
        return Evaluation(config, True, met, good if met else 0.0, badness(slo, result.snapshot), result.snapshot)


def _meets(record: RequestRecord, slo: SLOSpec) -> bool:
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
