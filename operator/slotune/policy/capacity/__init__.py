"""Capacity control: the replicas a moving load needs, planned a start-up ahead and judged by what they served.

The tuning loop asks `plan` once per window, whatever the configuration search is doing; the search changes engine
knobs only while the plan says the deployment is steady. See `plan` for the rules and docs/architecture.md for how
the two controllers share the loop.
"""

from slotune.policy.capacity.estimate import CapacityEstimate
from slotune.policy.capacity.forecast import RateForecast
from slotune.policy.capacity.ownership import owns_replicas, search_tuning
from slotune.policy.capacity.plan import CapacityPlan, needed, plan
from slotune.policy.capacity.settings import CapacitySettings
from slotune.policy.capacity.state import CapacityState, ScaleStep
from slotune.policy.capacity.window import CapacityWindow

__all__ = ["CapacityEstimate", "CapacityPlan", "CapacitySettings", "CapacityState", "CapacityWindow",
           "RateForecast", "ScaleStep", "needed", "owns_replicas", "plan", "search_tuning"]
