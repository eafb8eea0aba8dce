"""The TunedModel API: typed spec and status, the single source of truth for the CRD (`slotune crd`).

Import from here: `from slotune.api import TunedModel, TunedModelSpec, TunedModelStatus, load_tunedmodel`.
"""

from slotune.api.resource import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    FieldError,
    InvalidTunedModel,
    ObjectMeta,
    TunedModel,
    load_tunedmodel,
    load_tunedmodels,
    parse_tunedmodel,
)
from slotune.api.spec import (
    Accelerator,
    HardwareSpec,
    ModelDtype,
    ModelSpec,
    Resources,
    RuntimeSpec,
    Toleration,
    TunedModelSpec,
)
from slotune.api.status import (
    MAX_HISTORY,
    Condition,
    ConditionStatus,
    ConditionType,
    DiagnosisReport,
    HistoryEntry,
    Observed,
    Percentiles,
    Phase,
    TunedModelStatus,
    Verdict,
)
from slotune.api.tuning import DEFAULT_KNOBS, QUALITY_KNOBS, IntRange, Knob, KnobBounds, TuningMode, TuningSpec

__all__ = [
    "API_VERSION", "DEFAULT_KNOBS", "GROUP", "KIND", "MAX_HISTORY", "PLURAL", "QUALITY_KNOBS", "VERSION",
    "Accelerator", "Condition", "ConditionStatus", "ConditionType", "DiagnosisReport", "FieldError", "HardwareSpec",
    "HistoryEntry", "IntRange", "InvalidTunedModel", "Knob", "KnobBounds", "ModelDtype", "ModelSpec",
    "ObjectMeta", "Observed", "Percentiles", "Phase", "Resources", "RuntimeSpec", "Toleration", "TunedModel",
    "TunedModelSpec", "TunedModelStatus", "TuningMode", "TuningSpec", "Verdict", "load_tunedmodel",
    "load_tunedmodels", "parse_tunedmodel",
]
