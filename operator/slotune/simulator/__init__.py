"""Discrete-event simulation of serving replicas under a config and a workload, producing a `MetricsSnapshot`."""

from slotune.simulator.cluster import Deployment, SimulationResult, simulate, simulate_workload
from slotune.simulator.replica import RequestRecord

__all__ = ["Deployment", "RequestRecord", "SimulationResult", "simulate", "simulate_workload"]
