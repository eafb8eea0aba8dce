"""What one tuning run is asked: the SLO, the tuning spec, the deployment priced by the performance model, the
config it starts from, and the declared workload; built from a TunedModel spec (`TuningProblem.from_spec`)."""

from __future__ import annotations

from dataclasses import dataclass

from slotune.api.spec import TunedModelSpec
from slotune.api.tuning import TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel.accelerators import accelerator
from slotune.perfmodel.deployment import Deployment
from slotune.perfmodel.model_profile import ModelProfile
from slotune.slo import SLOSpec
from slotune.workload import WorkloadSpec


@dataclass(frozen=True)
class TuningProblem:
    """What to tune and against what: the parts of a TunedModel spec the loop reads."""

    slo: SLOSpec
    tuning: TuningSpec
    deployment: Deployment
    initial: RuntimeConfig
    workload: WorkloadSpec | None = None
    draft_model: str | None = None  # spec.model.draftModel: draft_model speculation only with one

    @property
    def key(self) -> str:
        """The SLO and tuning as declared: Infeasible and Degraded re-open when the spec changes them."""
        return self.slo.model_dump_json() + self.tuning.model_dump_json()

    @classmethod
    def from_spec(cls, spec: TunedModelSpec, model: ModelProfile) -> TuningProblem:
        # count is 0 for cpu (no accelerator to request); the roofline still runs on one device.
        deployment = Deployment(model, accelerator(spec.hardware.accelerator.value), max(spec.hardware.count, 1),
                                max_model_len=spec.model.max_model_len or 8192)
        initial = spec.runtime.config.with_changes(replicas=spec.replicas)
        return cls(spec.slo, spec.tuning, deployment, initial, spec.workload, spec.model.draft_model)
