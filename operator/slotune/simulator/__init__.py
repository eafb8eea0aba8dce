"""Discrete-event simulation of serving replicas under a config and a workload, producing a `MetricsSnapshot`."""

from slotune.simulator.cluster import Deployment, SimulationResult, simulate, simulate_workload
from slotune.simulator.replica import SimulatedRequest

__all__ = ["Deployment", "SimulatedRequest", "SimulationResult", "simulate", "simulate_workload"]
