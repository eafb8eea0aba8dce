"""Who sizes replicas: capacity control, when the spec turns it on (`tuning.capacityControl`), the tuner may change
replicas and the bounds leave it room; the configuration search then searches engine knobs only (`search_tuning`)."""

from __future__ import annotations

from slotune.api.tuning import Knob, TuningSpec
from slotune.knobs import RuntimeConfig


def owns_replicas(tuning: TuningSpec, initial: RuntimeConfig) -> bool:
    if not tuning.capacity_control:
        return False
    most = tuning.bounds.max_replicas if tuning.bounds.max_replicas is not None else initial.replicas
    return Knob.REPLICAS in tuning.knobs and most > tuning.bounds.min_replicas


def search_tuning(tuning: TuningSpec, initial: RuntimeConfig) -> TuningSpec:
    """The tuning the configuration search works within: replicas left out when capacity control owns them."""
    if not owns_replicas(tuning, initial):
        return tuning
    return tuning.model_copy(update={"knobs": [k for k in tuning.knobs if k is not Knob.REPLICAS]})
