"""A continuous simulation of a trace: one fleet of replicas lives through it, window by window, with queues carried
over, replicas started (after a start-up delay) and drained, and knobs changed live, for controllers that act every
window (the tuning loop through `TraceDeployment`, the trace benchmark's autoscalers directly)."""

from slotune.simulator.continuous.backend import TraceDeployment
from slotune.simulator.continuous.simulation import TraceSimulation

__all__ = ["TraceDeployment", "TraceSimulation"]
