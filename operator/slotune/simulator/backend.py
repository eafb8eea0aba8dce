"""The simulator as a deployment: a `Backend` and `MeasurementSource` for the tuning loop, in tests and benchmarks.

Applying a config checks whether a runtime would start with it (weights and KV cache fit, as vLLM's memory profiling
checks) and fails like a crashed runtime when not; each measured window simulates fresh requests from the workload
with the next seed, so consecutive windows of one config differ like real windows do; with `replay` every window
replays the same planned requests, as benchmark mode (`tuning.mode: benchmark`) replays spec.workload.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slotune.knobs import RuntimeConfig
from slotune.loop.protocols import ApplyResult
from slotune.metrics.window import MetricsUnavailable, UnavailableReason
from slotune.perfmodel.deployment import Deployment
from slotune.simulator.cluster import simulate_workload
from slotune.snapshot import MetricsSnapshot
from slotune.workload import WorkloadSpec


@dataclass
class SimulatedDeployment:
    deployment: Deployment
    workload: WorkloadSpec
    requests_per_window: int = 200
    spec_acceptance_rate: float = 0.0
    seed: int = 0
    replay: bool = False
    running: RuntimeConfig | None = None
    applied: list[RuntimeConfig] = field(default_factory=list)  # every config applied, rollbacks included
    windows: int = 0

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        if config == self.running:
            return ApplyResult.success(changed=False)  # the loop's check that what runs is still the config
        self.applied.append(config)
        error = self.deployment.startup_error(config)
        if error is not None:
            self.running = None
            return ApplyResult.failure(error, crashed=True)
        self.running = config
        return ApplyResult.success()

    def ready(self) -> bool:
        return self.running is not None

    def measure(self, window_s: float) -> MetricsSnapshot:
        if self.running is None:
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE, "no runtime is serving")
        self.windows += 1
        seed = self.seed if self.replay else self.seed * 100_003 + self.windows
        return simulate_workload(self.deployment, self.running, self.workload, self.requests_per_window, seed=seed,
                                 spec_acceptance_rate=self.spec_acceptance_rate).snapshot
