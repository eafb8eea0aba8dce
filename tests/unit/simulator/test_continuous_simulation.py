"""The continuous trace simulation: queues carry over windows, a new replica serves only after its start-up (and costs
from its order), a removed replica drains what it holds, arrivals join the shortest queue, and the loop's protocols
(WindowOpen until a window ends, rolling_out while a replica starts) hold for `slotune.loop.Tuner`."""

from __future__ import annotations

import pytest

from slotune.api.tuning import TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop import MemoryStateStore, Tuner, TuningProblem
from slotune.loop.protocols import WindowOpen
from slotune.perfmodel.deployment import Deployment
from slotune.simulator.continuous import TraceDeployment, TraceSimulation
from slotune.slo import SLOSpec
from slotune.workload import PlannedRequest

DEPLOYMENT = Deployment.from_names("llama-3.1-8b", "nvidia-a100-40gb")


def requests(times_s: list[float], prompt: int = 1000, output: int = 100) -> list[PlannedRequest]:
    return [PlannedRequest(t, prompt, output, None, 0) for t in times_s]


def test_a_backlog_carries_over_into_the_next_window() -> None:
    # 400 long requests in the first second: far more than one replica with 8 sequences serves in 10 s.
    simulation = TraceSimulation(DEPLOYMENT, RuntimeConfig(max_num_seqs=8, replicas=1),
                                 requests([i / 400 for i in range(400)], output=200), startup_s=0.0)
    first = simulation.run_window(10.0)
    assert first.arrival_rate_per_s == pytest.approx(40.0)
    assert first.num_waiting_end and first.num_waiting_end > 100
    second = simulation.run_window(10.0)
    assert second.arrival_rate_per_s == 0.0
    assert second.num_requests > 0  # requests that arrived in the first window finish in the second
    assert second.request_rate_per_s == pytest.approx(second.num_requests / 10.0)
    assert second.num_waiting_end < first.num_waiting_end
    assert second.queue.p50_ms > 10_000  # they waited through the window boundary


def test_a_new_replica_serves_only_after_its_start_up_and_costs_from_its_order() -> None:
    simulation = TraceSimulation(DEPLOYMENT, RuntimeConfig(replicas=1), requests([i * 0.5 for i in range(600)]),
                                 startup_s=120.0)
    simulation.run_window(60.0)
    simulation.set_config(RuntimeConfig(replicas=2))
    simulation.run_window(60.0)
    assert (simulation.num_ready, simulation.num_starting) == (1, 1)
    simulation.run_window(60.0)
    simulation.run_window(60.0)
    assert (simulation.num_ready, simulation.num_starting) == (2, 0)
    assert simulation.gpu_seconds == pytest.approx(240.0 + 180.0)
    newcomer = simulation.fleet.members[1]
    assert newcomer.ready_at_s == pytest.approx(180.0)
    assert newcomer.replica.records and min(r.arrival_s for r in newcomer.replica.records) >= 180.0


def test_a_removed_replica_drains_what_it_holds_and_then_stops_costing() -> None:
    simulation = TraceSimulation(DEPLOYMENT, RuntimeConfig(replicas=2), requests([0.0, 0.01, 0.02, 0.03],
                                                                                 output=2000), startup_s=0.0)
    simulation.run_window(1.0)
    loads = [m.replica.num_outstanding for m in simulation.fleet.members]
    assert loads == [2, 2]  # join-shortest-queue split the four
    simulation.set_config(RuntimeConfig(replicas=1))
    drained = next(m for m in simulation.fleet.members if m.draining)
    while not simulation.done:
        simulation.run_window(10.0)
    assert len(simulation.finished) == 4  # nothing the drained replica held was lost
    assert drained.released_at_s is not None and 1.0 < drained.released_at_s < simulation.now_s
    assert drained.released_at_s == pytest.approx(max(r.finish_s for r in drained.replica.records))
    assert simulation.gpu_seconds == pytest.approx(simulation.now_s + drained.released_at_s)


def test_a_starting_replica_is_cancelled_first_and_costs_only_until_then() -> None:
    simulation = TraceSimulation(DEPLOYMENT, RuntimeConfig(replicas=1), requests([1.0]), startup_s=120.0)
    simulation.set_config(RuntimeConfig(replicas=2))
    simulation.run_window(30.0)
    simulation.set_config(RuntimeConfig(replicas=1))
    assert simulation.num_starting == 0
    simulation.run_window(30.0)
    assert simulation.gpu_seconds == pytest.approx(60.0 + 30.0)


def test_arrivals_while_nothing_serves_wait_at_the_gateway() -> None:
    simulation = TraceSimulation(DEPLOYMENT, RuntimeConfig(replicas=1), requests([5.0, 50.0]), startup_s=20.0)
    simulation.set_config(RuntimeConfig(replicas=0))
    simulation.run_window(1.0)
    simulation.set_config(RuntimeConfig(replicas=1))  # ordered at 1 s: serves from 21 s
    while not simulation.done:
        simulation.run_window(30.0)
    first, second = sorted(simulation.finished, key=lambda r: r.arrival_s)
    assert first.arrival_s == 5.0 and first.first_scheduled_s >= 21.0
    assert second.first_scheduled_s == pytest.approx(50.0)


def test_backend_answers_as_the_loop_protocol_says() -> None:
    simulation = TraceSimulation(DEPLOYMENT, RuntimeConfig(replicas=1), requests([i * 0.2 for i in range(2000)]),
                                 startup_s=90.0)
    backend = TraceDeployment(simulation, DEPLOYMENT, window_s=60.0)
    with pytest.raises(WindowOpen):
        backend.measure(60.0)
    window = backend.advance()
    assert backend.measure(60.0) is window
    with pytest.raises(WindowOpen):  # read once
        backend.measure(60.0)
    assert backend.apply(RuntimeConfig(replicas=2)).in_progress
    backend.advance()
    assert backend.apply(RuntimeConfig(replicas=2)).in_progress
    backend.advance()
    result = backend.apply(RuntimeConfig(replicas=2))
    assert result.ok and not result.changed
    too_small = Deployment.from_names("llama-3.1-70b", "nvidia-a100-40gb")
    refused = TraceDeployment(simulation, too_small, 60.0).apply(RuntimeConfig(replicas=3))
    assert refused.crashed and simulation.config.replicas == 2


def test_the_tuner_runs_unmodified_window_by_window() -> None:
    simulation = TraceSimulation(DEPLOYMENT, RuntimeConfig(max_num_seqs=4, replicas=1),
                                 requests([i * 0.25 for i in range(2400)]), startup_s=60.0)
    backend = TraceDeployment(simulation, DEPLOYMENT, window_s=60.0)
    slo = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
    tuning = TuningSpec.model_validate({"windowSeconds": 60, "bounds": {"maxReplicas": 4}})
    tuner = Tuner(TuningProblem(slo, tuning, DEPLOYMENT, simulation.config), backend, backend, MemoryStateStore(),
                  clock=backend.clock)
    for _ in range(8):
        backend.advance()
        state = tuner.step()
    assert state.iteration >= 3  # windows judged
    assert backend.num_applied >= 1  # it changed something facing a 4-sequence batch at 4 req/s
