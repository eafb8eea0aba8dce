"""The foresight yardstick (slotune.tracebench.hindsight): replicas per window from the arrivals to come, serving at
once, and the search for the cheapest such pool that reaches a bar, on the real continuous simulation."""

from __future__ import annotations

from dataclasses import replace

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment, Efficiency
from slotune.slo import SLOSpec
from slotune.tracebench.baselines import StaticPool
from slotune.tracebench.hindsight import GROW, hindsight_pool, schedule
from slotune.tracebench.metrics import pass_figures
from slotune.tracebench.replay import replay
from slotune.tracebench.run import _baseline
from slotune.workload import PlannedRequest

SLO = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
WINDOW_S = 60.0


def arrivals(rates: list[float]) -> tuple[PlannedRequest, ...]:
    """Evenly spaced requests at each window's rate (req/s), 512-token prompts and 128-token outputs."""
    out = []
    for k, rate in enumerate(rates):
        n = round(rate * WINDOW_S)
        out += [PlannedRequest(k * WINDOW_S + (i + 0.5) * WINDOW_S / n, 512, 128, 0, 0) for i in range(n)]
    return tuple(out)


def test_the_schedule_is_each_windows_arrivals_over_the_trusted_rate_within_the_bounds() -> None:
    requests = arrivals([2.0, 8.0, 0.5, 0.5])
    # A window after a busy one keeps its replicas: the busy window's requests are still in service.
    assert schedule(requests, 240.0, WINDOW_S, 3.0, 12) == (1, 3, 3, 1)
    assert schedule(requests, 240.0, WINDOW_S, 3.0, 2) == (1, 2, 2, 1)
    assert schedule(requests, 300.0, WINDOW_S, 3.0, 12) == (1, 3, 3, 1, 1)  # a window with nothing still runs one


def test_the_pool_found_reaches_the_bar_follows_the_load_and_costs_less_than_sizing_for_the_peak() -> None:
    named = Deployment.from_names("llama-3.1-8b", "nvidia-a100-40gb")
    deployment = replace(named, efficiency=Efficiency.prior(named.accelerator))
    config = RuntimeConfig.model_validate({"maxNumSeqs": 128, "maxNumBatchedTokens": 2048})
    requests = arrivals([2.0, 2.0, 16.0, 16.0, 2.0, 2.0])
    pool = hindsight_pool(deployment, config, "default", SLO, requests, 360.0, WINDOW_S, 12, 0.99, guess_per_s=1.0)
    assert pool.reached and pool.figures.attainment >= 0.99
    assert pool.per_replica_per_s > GROW * 1.0  # it searched upward from a guess that was too cautious
    counts = pool.replicas
    assert counts == schedule(requests, 360.0, WINDOW_S, pool.per_replica_per_s, 12)
    assert counts[2] > counts[0] and counts[3] > counts[5] and counts[4] == counts[3]
    peak = StaticPool(max(counts))
    sized = replay("static-peak", "default", "", deployment, config.with_changes(replicas=peak.size), requests,
                   360.0, 0.0, WINDOW_S, 12, _baseline(peak))
    assert pool.figures.gpu_hours < pass_figures(sized, SLO, 0, WINDOW_S).gpu_hours
