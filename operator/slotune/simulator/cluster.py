"""N simulated replicas behind a round-robin load balancer, turned into the same `MetricsSnapshot` a real window gives.

Round robin assigns the i-th arriving request to replica i mod N whatever the replicas' state (as a Kubernetes
Service does per connection), so each replica can be simulated on its own share of the arrivals.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Deployment", "SimulationResult", "simulate", "simulate_workload"]

from slotune.knobs import RuntimeConfig, SpeculativeMethod
from slotune.perfmodel.deployment import Deployment
from slotune.simulator.replica import ReplicaResult, ReplicaSimulator, SimulatedRequest, SpeculationModel
from slotune.simulator.window import build_snapshot
from slotune.snapshot import MetricsSnapshot
from slotune.workload import PlannedRequest, WorkloadSpec, plan_requests

# A draft model costs about this fraction of a target decode step per drafted token (a ~10x smaller model).
DRAFT_MODEL_COST_PER_TOKEN = 0.1


@dataclass(frozen=True)
class SimulationResult:
    snapshot: MetricsSnapshot
    records: tuple[SimulatedRequest, ...]


def simulate(deployment: Deployment, config: RuntimeConfig, requests: list[PlannedRequest],
             spec_acceptance_rate: float = 0.0) -> SimulationResult:
    """Serve `requests` with `config.replicas` replicas and measure the window like the runtime's metrics would."""
    if config.replicas < 1:
        raise ValueError("cannot simulate zero replicas")
    step_model = deployment.step_model(config)
    capacity = deployment.kv_capacity_tokens(config)
    speculation = SpeculationModel.for_config(config, spec_acceptance_rate)
    draft_s = 0.0
    if config.speculative is not None and config.speculative.method is SpeculativeMethod.DRAFT_MODEL:
        drafts = config.speculative.num_speculative_tokens
        draft_s = DRAFT_MODEL_COST_PER_TOKEN * drafts * step_model.decode_step_s(1, 0)
    results: list[ReplicaResult] = []
    for index in range(config.replicas):
        share = requests[index::config.replicas]
        results.append(ReplicaSimulator(config, step_model, capacity, speculation, draft_s).run(share))
    snapshot = build_snapshot(results, requests, config, spec_acceptance_rate)
    return SimulationResult(snapshot, tuple(r for result in results for r in result.records))


def simulate_workload(deployment: Deployment, config: RuntimeConfig, workload: WorkloadSpec, num_requests: int,
                      seed: int = 0, spec_acceptance_rate: float = 0.0) -> SimulationResult:
    """Plan `num_requests` from the workload with `seed` and simulate them."""
    return simulate(deployment, config, plan_requests(workload, num_requests=num_requests, seed=seed),
                    spec_acceptance_rate)
