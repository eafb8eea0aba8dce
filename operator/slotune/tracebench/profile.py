"""Profiled capacity: the highest constant arrival rate one replica of a config serves within the SLO, sustained,
found on the simulator, as Dynamo's planner profiles a worker before it plans (and as an offline sweep would rank
configs).

The requests are the trace from its busiest stretch on (its lengths and prefix blocks, from the start again where the
trace ends first) at Poisson arrivals of the rate tried (seeded: the same gaps every time), as a profiling sweep
drives a worker: evenly spaced arrivals overstated capacity (Azure, 8B on A100: 9 req/s profiled where 3 replicas
barely held 15), and the trace's own gaps carry its accidents (Mooncake opens with dozens of requests at one timestamp,
a burst no rate scaling spreads). A rate is held long enough to show an overload (`stretch_length`): an engine that
starts empty takes the first of an overload into a growing batch until `max_num_seqs` run, and only then queues, so a
short stretch measures that transient. Measured on the Azure trace, 70B on H100 at a 1024-token budget: 300 requests
(25 s) at 12 req/s met the SLO with a TTFT P99 of 1.9 s, 1,200 at the same rate read 18 s; profiled on 300 requests
that config served 12 req/s, held as long as `stretch_length` asks it serves 7.5. The first `WARMUP` are left out
of the judgement (they meet an empty engine). The rate is doubled until the SLO breaks, then bisected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.simulator.continuous import TraceSimulation
from slotune.slo import SLOSpec
from slotune.tracebench.attainment import percentiles_met
from slotune.workload import PlannedRequest

NUM_REQUESTS = 300  # the fewest requests a rate is judged on
OVERLOAD = 0.1  # a rate this much above what a replica sustains shows its queue within the stretch
MAX_REQUESTS = 3000  # the most (a simulated request costs time): past it, only a larger overload shows
WARMUP = 40
BISECTIONS = 3
MIN_RATE_PER_S = 0.02
SEED = 0


@dataclass(frozen=True)
class Capacity:
    rate_per_s: float  # SLO-meeting arrivals per second per replica


def meets_at(deployment: Deployment, config: RuntimeConfig, slo: SLOSpec, lengths: list[PlannedRequest],
             rate_per_s: float, count: int | None = None) -> bool:
    """Whether one replica meets the SLO at `rate_per_s`, held for `count` requests (default: `stretch_length`)."""
    count = stretch_length(config, slo, rate_per_s) if count is None else count
    stretch = [lengths[i % len(lengths)] for i in range(count)]
    arrivals_s = np.cumsum(np.random.default_rng(SEED).exponential(1.0 / rate_per_s, len(stretch)))
    requests = [PlannedRequest(float(t), r.prompt_tokens, r.output_tokens, None, r.shared_prefix_tokens,
                               r.prefix_block_ids) for t, r in zip(arrivals_s, stretch, strict=True)]
    simulation = TraceSimulation(deployment, config.with_changes(replicas=1), requests, 0.0, record_itl=False)
    span_s = requests[-1].arrival_s + 1.0
    while not simulation.done:
        simulation.run_window(span_s)
        if simulation.now_s > 20 * span_s:  # hopelessly behind: it does not meet the SLO at this rate
            return False
    judged = [r for r in simulation.finished if r.arrival_s >= requests[min(WARMUP, len(requests) - 1)].arrival_s]
    return percentiles_met(slo, judged, span_s)


def stretch_length(config: RuntimeConfig, slo: SLOSpec, rate_per_s: float) -> int:
    """Requests a rate is held for. At OVERLOAD above what a replica sustains the backlog grows by OVERLOAD x the
    arrivals once `max_num_seqs` run, so filling the batch and then queueing the longest TTFT target's worth of
    arrivals takes (max_num_seqs + target x rate) / OVERLOAD of them; the judged ones come after WARMUP."""
    ttft = slo.ttft
    wait_s = 0.0 if ttft is None else max((v for v in (ttft.p50, ttft.p95, ttft.p99) if v), default=0.0) / 1000.0
    count = NUM_REQUESTS + (config.max_num_seqs + wait_s * rate_per_s) / OVERLOAD
    return min(math.ceil(count), MAX_REQUESTS)


def profile_capacity(deployment: Deployment, config: RuntimeConfig, slo: SLOSpec,
                     lengths: list[PlannedRequest]) -> Capacity:
    low, high = 0.0, 0.5
    while meets_at(deployment, config, slo, lengths, high):
        low, high = high, high * 2
        if high > 1000:
            break
    while low == 0.0 and high > MIN_RATE_PER_S:  # not even half a request a second: look lower
        low, high = (high / 2, high) if meets_at(deployment, config, slo, lengths, high / 2) else (0.0, high / 2)
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        low, high = (middle, high) if meets_at(deployment, config, slo, lengths, middle) else (low, middle)
    return Capacity(max(low, MIN_RATE_PER_S))  # at the floor: the SLO fails even nearly idle
