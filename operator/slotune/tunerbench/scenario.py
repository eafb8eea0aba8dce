"""A tuner-benchmark scenario: model, accelerator, workload, SLO, the poor starting config and the knob bounds.

Scenario files are YAML with camelCase keys (bench/scenarios/README.md documents the format); nested blocks reuse the
TunedModel API's types (`WorkloadSpec`, `SLOSpec`, `RuntimeConfig`, `TuningSpec`), so a scenario reads like a spec.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from slotune.api.tuning import TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loadgen.workload import WorkloadSpec
from slotune.perfmodel.deployment import Deployment
from slotune.slo import SLOSpec


class Scenario(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    name: str = Field(min_length=1, description="Unique name, used in the results.")
    model: str = Field(description="perfmodel model profile, e.g. llama-3.1-8b.")
    accelerator: str = Field(description="Accelerator profile, e.g. nvidia-h100-80gb.")
    tensor_parallel: int = Field(default=1, ge=1, le=8)
    max_model_len: int = Field(default=8192, ge=256)
    workload: WorkloadSpec
    spec_acceptance_rate: float = Field(default=0.5, ge=0, lt=1, description="Per-token draft acceptance.")
    slo: SLOSpec
    start: RuntimeConfig = Field(description="The deliberately poor starting configuration (replicas included).")
    tuning: TuningSpec = Field(default=TuningSpec())
    requests_per_window: int = Field(default=150, ge=20, le=5000)
    seed: int = Field(default=0, description="Seed of the replayed workload window.")
    note: str = Field(default="", description="What the scenario exercises.")

    @property
    def deployment(self) -> Deployment:
        return Deployment.from_names(self.model, self.accelerator, self.tensor_parallel, self.max_model_len)


def load_scenarios(directory: Path) -> list[Scenario]:
    """Every *.yaml scenario in `directory`, sorted by name."""
    paths = sorted(directory.glob("*.yaml"))
    if not paths:
        raise FileNotFoundError(f"no *.yaml scenarios in {directory}")
    scenarios = []
    for path in paths:
        try:
            scenarios.append(Scenario.model_validate(yaml.safe_load(path.read_text())))
        except Exception as error:
            raise ValueError(f"{path}: {error}") from error
    names = [s.name for s in scenarios]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate scenario names: {', '.join(duplicates)}")
    return sorted(scenarios, key=lambda s: s.name)
