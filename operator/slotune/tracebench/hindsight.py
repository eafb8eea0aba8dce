"""What a simple replica pool with perfect foresight costs: a yardstick for the cost goals, not a strategy.

Every strategy in the benchmark runs blind and pays its replicas' start-up. The hindsight pool does neither: before
each window it knows the arrivals the window will carry and runs ceil(arrivals / C) replicas, serving at once (no
start-up, nothing ordered ahead). C, the requests/s one replica is trusted with, is searched for the largest value at
which the pass still reaches the attainment the goal asks of slotune (`goal.required_attainment`: every baseline's),
so the pool is the cheapest of its kind that is as good. It is no lower bound: one C for every window is a crude
rule (on a noisy rate the static pool can be cheaper, and on the L4 pairs, where requests outlive windows, slotune's
tuned engine config and learned capacity are), so the goal check compares with the cheaper of it and the static pool
(`goal`). Where foresight of this kind pays more than a goal allows, a controller sizing replicas from the load needs
more than foresight to meet it; where slotune pays more than foresight, the gap is the price of not knowing the next
start-up's arrivals (and of any engine config slotune did not find).

It replays one pass (the second day equals the first, and the pool learns nothing), from the first window's count.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.simulator.continuous import TraceSimulation
from slotune.slo import SLOSpec
from slotune.tracebench.baselines import FleetView
from slotune.tracebench.metrics import PassFigures, pass_figures
from slotune.tracebench.replay import replay
from slotune.workload import PlannedRequest

GROW = 1.25  # C is raised by this factor until the bar fails (or lowered until it holds)...
MAX_PROBES = 12  # ...then bisected: at most this many replays in all
SETTLE = 1.03  # the bisection stops once the bounds are this close


@dataclass(frozen=True)
class HindsightPool:
    """The cheapest hindsight pool found for one engine config (`figures` of its one pass)."""

    engine_config: str
    per_replica_per_s: float  # C: the requests/s each replica carried at most
    figures: PassFigures
    probes: int  # replays the search took
    reached: bool  # the pool reaches the bar (else: the most replicas tried, short of it)
    replicas: tuple[int, ...] = ()  # per window of the pass, at C


def schedule(requests: Sequence[PlannedRequest], pass_s: float, window_s: float, per_replica_per_s: float,
             max_replicas: int) -> tuple[int, ...]:
    """Replicas per window: ceil(its arrival rate / C), or the window before's where that was higher (its requests
    are still in service: sizing for the window's own arrivals alone cost the L4 pair a fifth more GPU-hours, as a
    lower C had to cover the drop), at least one, at most `max_replicas`."""
    arrived = Counter(int(r.arrival_s // window_s) for r in requests)
    windows = max(math.ceil(pass_s / window_s), max(arrived, default=0) + 1)
    held = [max(arrived[k], arrived[k - 1] if k > 0 else 0) for k in range(windows)]
    return tuple(max(1, min(max_replicas, math.ceil(n / window_s / per_replica_per_s - 1e-9))) for n in held)


def hindsight_pool(deployment: Deployment, config: RuntimeConfig, label: str, slo: SLOSpec,
                   requests: tuple[PlannedRequest, ...], pass_s: float, window_s: float, max_replicas: int,
                   bar: float, guess_per_s: float) -> HindsightPool:
    """The largest C (from `guess_per_s`, e.g. the static pool's per-replica share of the peak) whose hindsight
    pool reaches `bar`; where none does, the smallest C tried (the most replicas)."""
    tried: dict[float, PassFigures] = {}

    def holds(per_s: float) -> bool:
        counts = schedule(requests, pass_s, window_s, per_s, max_replicas)
        tried[per_s] = _replay(deployment, config, slo, requests, pass_s, window_s, max_replicas, counts)
        return tried[per_s].attainment >= bar

    low: float | None = None  # the largest C known to hold
    high: float | None = None  # the smallest C known to fail
    per_s = max(guess_per_s, 1e-6)
    while len(tried) < MAX_PROBES and (low is None or high is None):
        if holds(per_s):
            low, per_s = per_s, per_s * GROW
        else:
            high, per_s = per_s, per_s / GROW
    while low is not None and high is not None and high / low > SETTLE and len(tried) < MAX_PROBES:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if holds(middle) else (low, middle)
    best = low if low is not None else min(tried)
    return HindsightPool(label, best, tried[best], len(tried), low is not None,
                         schedule(requests, pass_s, window_s, best, max_replicas))


def _replay(deployment: Deployment, config: RuntimeConfig, slo: SLOSpec, requests: tuple[PlannedRequest, ...],
            pass_s: float, window_s: float, max_replicas: int, counts: tuple[int, ...]) -> PassFigures:
    """One pass at `counts` replicas per window, each window's count serving from its start."""
    windows = iter(counts[1:])

    def decide(simulation: TraceSimulation, view: FleetView) -> RuntimeConfig:
        return simulation.config.with_changes(replicas=next(windows, counts[-1]))

    run = replay("hindsight", "", "", deployment, config.with_changes(replicas=counts[0]), requests, pass_s, 0.0,
                 window_s, max_replicas, decide)
    return pass_figures(run, slo, 0, window_s)
