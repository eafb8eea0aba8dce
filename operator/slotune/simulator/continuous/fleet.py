"""The replicas of a continuous simulation over time: ordered, starting, serving, draining, gone.

A replica ordered at t serves from t + startup_s and costs GPU time from t (the GPUs are held while the runtime
loads). Fewer replicas drain: replicas still starting are cancelled first (newest first: their GPU time stops at
once), then serving replicas with the fewest requests in flight stop receiving requests and finish the ones they
hold; their GPU time stops when the last one finishes.

Routing is join-shortest-queue: each arrival goes to the serving replica with the fewest requests in flight (waiting
plus running), ties to the oldest replica. This is the least-loaded routing of vLLM's production stack and llm-d's
load-aware scorer, rather than a Kubernetes Service's per-connection round robin.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotune.knobs import RuntimeConfig, SpeculativeMethod
from slotune.perfmodel.deployment import Deployment
from slotune.perfmodel.roofline import StepTimeModel
from slotune.simulator.cluster import DRAFT_MODEL_COST_PER_TOKEN
from slotune.simulator.continuous.replica import TraceReplica
from slotune.simulator.replica import SpeculationModel
from slotune.workload import PlannedRequest


@dataclass
class FleetMember:
    replica: TraceReplica
    ordered_at_s: float
    ready_at_s: float
    draining: bool = False
    released_at_s: float | None = None  # when it stopped costing GPU time

    def serving(self, now_s: float) -> bool:
        return not self.draining and self.released_at_s is None and now_s >= self.ready_at_s

    def starting(self, now_s: float) -> bool:
        return not self.draining and self.released_at_s is None and now_s < self.ready_at_s

    def gpu_seconds(self, now_s: float, gpus: int) -> float:
        end_s = self.released_at_s if self.released_at_s is not None else now_s
        return max(0.0, end_s - self.ordered_at_s) * gpus


class Fleet:
    def __init__(self, deployment: Deployment, config: RuntimeConfig, startup_s: float,
                 spec_acceptance_rate: float = 0.0, record_itl: bool = True) -> None:
        self.deployment, self.startup_s, self.acceptance = deployment, startup_s, spec_acceptance_rate
        self.record_itl = record_itl
        self.config = config
        self.members: list[FleetMember] = []
        self.gpus_per_replica = deployment.tensor_parallel
        for _ in range(config.replicas):  # the starting pool was deployed before the trace begins
            self._order(0.0, ready_at_s=0.0)

    # -- what a controller and a report read ----------------------------------------------------------------------

    def num_serving(self, now_s: float) -> int:
        return sum(m.serving(now_s) for m in self.members)

    def num_starting(self, now_s: float) -> int:
        return sum(m.starting(now_s) for m in self.members)

    def gpu_seconds(self, now_s: float) -> float:
        return sum(m.gpu_seconds(now_s, self.gpus_per_replica) for m in self.members)

    def active(self) -> list[FleetMember]:
        """Replicas that still hold GPUs (serving, starting or draining)."""
        return [m for m in self.members if m.released_at_s is None]

    # -- changes --------------------------------------------------------------------------------------------------

    def set_config(self, config: RuntimeConfig, now_s: float) -> None:
        """Engine knobs apply to every replica at once; the replica count converges by ordering or draining."""
        if config.model_copy(update={"replicas": 1}) != self.config.model_copy(update={"replicas": 1}):
            parts = self._engine(config)
            for member in self.active():
                member.replica.reconfigure(config, *parts)
        self.config = config
        wanted = config.replicas
        current = [m for m in self.active() if not m.draining]
        for _ in range(wanted - len(current)):
            self._order(now_s, now_s + self.startup_s)
        for member in self._to_remove(current, now_s, len(current) - wanted):
            idle = member.starting(now_s) or member.replica.num_outstanding == 0
            member.draining = True
            if idle:
                member.released_at_s = now_s

    def route(self, request: PlannedRequest, now_s: float) -> bool:
        """Send `request` to the least-loaded replica serving at `now_s`; False when none serves."""
        serving = [m for m in self.members if m.serving(now_s)]
        if not serving:
            return False
        chosen = min(serving, key=lambda m: m.replica.num_outstanding)
        chosen.replica.enqueue(request)
        return True

    def advance_to(self, until_s: float) -> None:
        for member in self.active():
            if until_s > member.ready_at_s or member.replica.num_outstanding:
                member.replica.advance_to(until_s)
            if member.draining and member.replica.num_outstanding == 0:
                records = member.replica.records  # in finish order: the last one freed its GPUs
                member.released_at_s = max(records[-1].finish_s if records else until_s, member.ready_at_s)

    def next_ready_s(self, after_s: float) -> float | None:
        return min((m.ready_at_s for m in self.active() if m.ready_at_s > after_s and not m.draining), default=None)

    # -- internals ------------------------------------------------------------------------------------------------

    def _to_remove(self, current: list[FleetMember], now_s: float, count: int) -> list[FleetMember]:
        if count <= 0:
            return []
        starting = sorted((m for m in current if m.starting(now_s)), key=lambda m: -m.ordered_at_s)
        serving = sorted((m for m in current if not m.starting(now_s)), key=lambda m: m.replica.num_outstanding)
        return (starting + serving)[:count]

    def _order(self, now_s: float, ready_at_s: float) -> None:
        replica = TraceReplica(self.config, *self._engine(self.config), now_s=ready_at_s, record_itl=self.record_itl)
        self.members.append(FleetMember(replica, now_s, ready_at_s))

    def _engine(self, config: RuntimeConfig) -> tuple[StepTimeModel, int, SpeculationModel, float]:
        step_model = self.deployment.step_model(config)
        speculation = SpeculationModel.for_config(config, self.acceptance)
        draft_s = 0.0
        if config.speculative is not None and config.speculative.method is SpeculativeMethod.DRAFT_MODEL:
            draft_s = (DRAFT_MODEL_COST_PER_TOKEN * config.speculative.num_speculative_tokens
                       * step_model.decode_step_s(1, 0))
        return step_model, self.deployment.kv_capacity_tokens(config), speculation, draft_s
