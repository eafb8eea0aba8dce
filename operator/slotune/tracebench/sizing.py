"""The static pool a capacity planner would buy: the fewest replicas that meet the SLO over the trace's busiest five
minutes, found by simulating that stretch (from a fleet already serving: it starts two minutes before the peak) with
a replica count searched from a capacity estimate both ways. It looks at the whole trace ahead of time, as sizing for
a known peak does; it then runs blind like every other strategy."""

from __future__ import annotations

from collections.abc import Sequence

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.simulator.continuous import TraceSimulation
from slotune.slo import SLOSpec
from slotune.tracebench.attainment import percentiles_met
from slotune.workload import PlannedRequest

PEAK_S = 300.0
LEAD_S = 120.0  # served before the peak, so it meets a fleet already busy


def busiest_start_s(requests: Sequence[PlannedRequest], span_s: float = PEAK_S) -> float:
    """Start of the `span_s` stretch with the most arrivals (stretches start at arrivals)."""
    arrivals = [r.arrival_s for r in requests]
    best, best_start, j = 0, 0.0, 0
    for i, start in enumerate(arrivals):
        while j < len(arrivals) and arrivals[j] < start + span_s:
            j += 1
        if j - i > best:
            best, best_start = j - i, start
    return best_start


def peak_pool(deployment: Deployment, config: RuntimeConfig, slo: SLOSpec, requests: Sequence[PlannedRequest],
              max_replicas: int, guess: int) -> int:
    """The fewest replicas meeting the SLO over the peak, searched from `guess` (a capacity estimate) both ways."""
    start_s = busiest_start_s(requests)
    lead_s = min(LEAD_S, start_s)
    stretch = [PlannedRequest(r.arrival_s - start_s + lead_s, r.prompt_tokens, r.output_tokens, r.prefix_group,
                              r.shared_prefix_tokens, r.prefix_block_ids)
               for r in requests if start_s - lead_s <= r.arrival_s < start_s + PEAK_S]

    def meets(replicas: int) -> bool:
        simulation = TraceSimulation(deployment, config.with_changes(replicas=replicas), stretch, 0.0,
                                     record_itl=False)
        simulation.run_window(lead_s + PEAK_S)
        while not simulation.done and simulation.now_s < lead_s + 3 * PEAK_S:
            simulation.run_window(PEAK_S)
        judged = [r for r in simulation.finished if r.arrival_s >= lead_s]
        unfinished = sum(r.arrival_s >= lead_s for r in stretch) - len(judged)
        return unfinished == 0 and percentiles_met(slo, judged, PEAK_S)

    replicas = max(1, min(guess, max_replicas))
    if meets(replicas):
        while replicas > 1 and meets(replicas - 1):
            replicas -= 1
        return replicas
    while replicas < max_replicas:
        replicas += 1
        if meets(replicas):
            return replicas
    return max_replicas
