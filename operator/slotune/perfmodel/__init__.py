"""Performance model: accelerator profiles, model profiles, the roofline step time and its calibration."""

from slotune.perfmodel.accelerators import ACCELERATORS, AcceleratorProfile, accelerator
from slotune.perfmodel.calibration import CalibrationResult, StepMeasurement, calibrate
from slotune.perfmodel.deployment import Deployment
from slotune.perfmodel.model_profile import MODELS, ModelProfile, model_profile
from slotune.perfmodel.roofline import Efficiency, StepCost, StepShape, StepTimeModel

__all__ = [
    "ACCELERATORS",
    "MODELS",
    "AcceleratorProfile",
    "CalibrationResult",
    "Deployment",
    "Efficiency",
    "ModelProfile",
    "StepCost",
    "StepMeasurement",
    "StepShape",
    "StepTimeModel",
    "accelerator",
    "calibrate",
    "model_profile",
]
