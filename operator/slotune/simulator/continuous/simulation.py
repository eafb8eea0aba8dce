"""A trace served window by window by a fleet whose size and knobs may change at any window boundary.

Time advances through the trace's arrivals: before each arrival every replica is advanced to it, then the request is
routed (fleet.py); a replica's queue and running batch carry over from one window to the next. Arrivals while no
replica serves wait at the gateway and are routed, in order, when the first one is ready. `run_window` ends a window
and returns its `MetricsSnapshot`, with the GPU time spent so far and the fleet's state readable in between.
`record_itl=False` leaves the inter-token histogram out (a controller that reads only TTFT and TPOT).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.simulator.continuous.fleet import Fleet
from slotune.simulator.continuous.window import WindowTotals, window_snapshot
from slotune.simulator.replica import SimulatedRequest
from slotune.snapshot import MetricsSnapshot
from slotune.workload import PlannedRequest


class TraceSimulation:
    def __init__(self, deployment: Deployment, config: RuntimeConfig, requests: Sequence[PlannedRequest],
                 startup_s: float, spec_acceptance_rate: float = 0.0, record_itl: bool = True) -> None:
        self.fleet = Fleet(deployment, config, startup_s, spec_acceptance_rate, record_itl)
        self.acceptance = spec_acceptance_rate
        self.pending: deque[PlannedRequest] = deque(sorted(requests, key=lambda r: r.arrival_s))
        self.held: deque[PlannedRequest] = deque()  # arrived while no replica served
        self.now_s = 0.0
        self.windows: list[MetricsSnapshot] = []
        self.finished: list[SimulatedRequest] = []  # every finished request, in window order
        self.num_failed = 0

    # -- what a controller or a report reads between windows -----------------------------------------------------

    @property
    def config(self) -> RuntimeConfig:
        return self.fleet.config

    @property
    def num_ready(self) -> int:
        return self.fleet.num_serving(self.now_s)

    @property
    def num_starting(self) -> int:
        return self.fleet.num_starting(self.now_s)

    @property
    def gpu_seconds(self) -> float:
        return self.fleet.gpu_seconds(self.now_s)

    @property
    def done(self) -> bool:
        return not self.pending and not self.held and all(m.replica.num_outstanding == 0
                                                          for m in self.fleet.active())

    def set_config(self, config: RuntimeConfig) -> None:
        self.fleet.set_config(config, self.now_s)

    # -- time -----------------------------------------------------------------------------------------------------

    def run_window(self, window_s: float) -> MetricsSnapshot:
        start_s, end_s = self.now_s, self.now_s + window_s
        before = WindowTotals.of(self.fleet)
        arrivals = []
        while self.pending and self.pending[0].arrival_s < end_s:
            request = self.pending.popleft()
            self._serve_held_until(request.arrival_s)
            self.fleet.advance_to(request.arrival_s)
            arrivals.append(request)
            if self.held or not self.fleet.route(request, request.arrival_s):
                self.held.append(request)
        self._serve_held_until(end_s)
        self.fleet.advance_to(end_s)
        self.now_s = end_s
        snapshot, finished = window_snapshot(self.fleet, before, arrivals, start_s, end_s, len(self.held),
                                             self.acceptance)
        self.finished.extend(finished)
        self.windows.append(snapshot)
        return snapshot

    def _serve_held_until(self, until_s: float) -> None:
        """Gateway-held arrivals go out, oldest first, once a replica serves (no later than `until_s`); they keep
        their arrival time, so their latency counts the wait."""
        while self.held:
            at_s = self.held[0].arrival_s
            if self.fleet.num_serving(at_s) == 0:
                ready_s = self.fleet.next_ready_s(at_s)
                if ready_s is None or ready_s > until_s:
                    return
                at_s = ready_s
            self.fleet.advance_to(at_s)
            if not self.fleet.route(self.held[0], at_s):
                return
            self.held.popleft()
