"""Load generation and client-side measurement: workloads, the streaming client, percentiles and A/B comparison."""

from slotune.workload import (
    Arrival,
    LengthDistribution,
    PlannedRequest,
    Profile,
    WorkloadSpec,
    iter_requests,
    plan_requests,
)

__all__ = [
    "Arrival",
    "LengthDistribution",
    "PlannedRequest",
    "Profile",
    "WorkloadSpec",
    "iter_requests",
    "plan_requests",
]
