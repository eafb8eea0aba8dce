"""A continuous simulation as the tuning loop's `Backend` and `MeasurementSource`, so `slotune.loop.Tuner` runs on a
replayed trace unmodified, window by window.

The driver owns time: `advance(window_s)` serves one more window of the trace and leaves its snapshot to be read; the
loop's `measure` returns it once and raises `WindowOpen` until the next window ends, so a step that only applies a
change never skips traffic. `clock` is the simulation's time as unix seconds, for the loop's cooldowns.

`apply` follows the protocol: a config whose replicas cannot start (weights or KV cache do not fit) fails as a crashed
runtime would and changes nothing; otherwise knobs change live on every replica and replicas are ordered or drained,
and the answer is `rolling_out` while an ordered replica is still starting, success once every one serves;
`replica_counts` tells capacity control which replicas serve and which are still starting.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotune.knobs import RuntimeConfig
from slotune.loop.protocols import ApplyResult, ReplicaCounts, WindowOpen
from slotune.metrics.window import MetricsUnavailable, UnavailableReason
from slotune.perfmodel.deployment import Deployment
from slotune.simulator.continuous.simulation import TraceSimulation
from slotune.snapshot import MetricsSnapshot

EPOCH_S = 1_800_000_000.0  # unix time the replay starts at (any fixed value: the loop only compares times)


@dataclass
class TraceDeployment:
    simulation: TraceSimulation
    deployment: Deployment
    window_s: float
    unread: MetricsSnapshot | None = None
    num_applied: int = 0  # configs that changed what runs

    def clock(self) -> float:
        return EPOCH_S + self.simulation.now_s

    def advance(self) -> MetricsSnapshot:
        self.unread = self.simulation.run_window(self.window_s)
        return self.unread

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        simulation = self.simulation
        if config != simulation.config:
            error = self.deployment.startup_error(config)
            if error is not None:
                return ApplyResult.failure(error, crashed=True)
            simulation.set_config(config)
            self.num_applied += 1
            changed = True
        else:
            changed = False
        if simulation.num_starting:
            return ApplyResult.rolling_out(f"{simulation.num_starting} replica(s) starting, "
                                           f"{simulation.num_ready} serving")
        return ApplyResult.success(changed=changed)

    def replica_counts(self) -> ReplicaCounts:
        return ReplicaCounts(ready=self.simulation.num_ready, starting=self.simulation.num_starting)

    def ready(self) -> bool:
        return self.simulation.num_ready > 0

    def measure(self, window_s: float) -> MetricsSnapshot:
        snapshot, self.unread = self.unread, None
        if snapshot is None:
            raise WindowOpen(self.clock() + self.window_s)
        if snapshot.num_requests == 0 and self.simulation.num_ready == 0:
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE, "no replica is serving")
        return snapshot
