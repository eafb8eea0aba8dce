"""A tuner-benchmark scenario: model, accelerator, workload, SLO, the poor starting config and the knob bounds.

Scenario files are YAML with camelCase keys (bench/scenarios/README.md documents the format); nested blocks reuse the
TunedModel API's types (`WorkloadSpec`, `SLOSpec`, `RuntimeConfig`, `TuningSpec`), so a scenario reads like a spec.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from slotune.api.tuning import TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.perfmodel.roofline import Efficiency
from slotune.slo import SLOSpec
from slotune.workload import WorkloadSpec


class HardwareSkew(BaseModel):
    """How the simulated hardware departs from the accelerator profile slotune prices configurations with.

    The simulator plays the deployment with these multipliers on the profile's efficiencies; the tuner is told the
    unskewed priors and learns the difference only from the windows it measures (online calibration, as it would
    facing a real engine slower or faster than its datasheet). Without skew the policy's capacity model and the
    benchmark's ground truth would share one roofline, which flatters it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    bandwidth: float = Field(default=1.0, gt=0, le=1.5, description="Multiplier on achieved memory bandwidth.")
    compute: float = Field(default=1.0, gt=0, le=1.5, description="Multiplier on achieved FLOP/s.")
    overhead: float = Field(default=1.0, gt=0, le=10, description="Multiplier on fixed per-step costs.")

    def apply(self, deployment: Deployment) -> Deployment:
        prior = deployment.efficiency or Efficiency.prior(deployment.accelerator)
        skewed = replace(prior, bandwidth=min(1.0, prior.bandwidth * self.bandwidth),
                         compute=min(1.0, prior.compute * self.compute),
                         step_overhead_s=prior.step_overhead_s * self.overhead,
                         layer_overhead_s=prior.layer_overhead_s * self.overhead)
        return replace(deployment, efficiency=skewed)


class WorkloadChange(BaseModel):
    """The traffic changing mid-run: after `afterWindows` measured windows the deployment serves another workload
    (and drafts are accepted at another rate). The final config is scored on the shifted workload."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    after_windows: int = Field(ge=1, le=100, description="Measured windows of the first workload before the shift.")
    workload: WorkloadSpec
    spec_acceptance_rate: float | None = Field(default=None, ge=0, lt=1, description="Acceptance after the shift "
                                               "(default: unchanged).")
    then: WorkloadChange | None = Field(default=None, description="The traffic changing again after `afterWindows` "
                                        "windows of this workload (a load that rises, then falls).")


class Scenario(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    name: str = Field(min_length=1, description="Unique name, used in the results.")
    model: str = Field(description="perfmodel model profile, e.g. llama-3.1-8b.")
    accelerator: str = Field(description="Accelerator profile, e.g. nvidia-h100-80gb.")
    tensor_parallel: int = Field(default=1, ge=1, le=8)
    max_model_len: int = Field(default=8192, ge=256)
    workload: WorkloadSpec
    spec_acceptance_rate: float = Field(default=0.5, ge=0, lt=1, description="Per-token draft acceptance.")
    hardware_skew: HardwareSkew = Field(default=HardwareSkew(), description="The simulated hardware's departure "
                                        "from the profile the tuner assumes.")
    slo: SLOSpec
    start: RuntimeConfig = Field(description="The deliberately poor starting configuration (replicas included).")
    tuning: TuningSpec = Field(default=TuningSpec())
    requests_per_window: int = Field(default=150, ge=20, le=5000)
    seed: int = Field(default=0, description="Seed of the replayed workload window.")
    note: str = Field(default="", description="What the scenario exercises.")
    shift: WorkloadChange | None = Field(default=None, description="The workload changing mid-run (default: never).")
    speed_noise: float = Field(default=0.0, ge=0, lt=0.5, description="Each window slotune measures runs the machine "
                               "at a speed drawn uniformly from 1 +- speedNoise (a noisy neighbour, clocks, thermals); "
                               "scoring and the oracle stay noise-free.")

    @property
    def final(self) -> Scenario:
        """The scenario as it ends: the last shifted workload where it shifts (what every strategy is scored on)."""
        return self.phases[-1][1]

    @property
    def phases(self) -> tuple[tuple[int, Scenario], ...]:
        """Each workload the run serves, with the measured windows before it starts (0 for the first), no shifts."""
        phases, start, scenario, change = [(0, self.initial)], 0, self.initial, self.shift
        while change is not None:
            start += change.after_windows
            acceptance = change.spec_acceptance_rate
            scenario = scenario.model_copy(update={"workload": change.workload, "spec_acceptance_rate":
                                                   scenario.spec_acceptance_rate if acceptance is None else acceptance})
            phases.append((start, scenario))
            change = change.then
        return tuple(phases)

    def speed(self, window: int) -> float:
        """The machine's speed in the window-th window measured (1 without `speed_noise`): a uniform draw seeded by
        the scenario and the window, so every run of the scenario sees the same machine."""
        if self.speed_noise == 0:
            return 1.0
        return 1.0 + random.Random(f"{self.name}/speed/{window}").uniform(-self.speed_noise, self.speed_noise)

    @property
    def initial(self) -> Scenario:
        """The scenario before any shift."""
        return self.model_copy(update={"shift": None})

    @property
    def deployment(self) -> Deployment:
        """What the tuner is told: the accelerator's profile with its prior efficiencies."""
        return Deployment.from_names(self.model, self.accelerator, self.tensor_parallel, self.max_model_len)

    @property
    def simulated_deployment(self) -> Deployment:
        """What the simulator plays: the same hardware with `hardware_skew` applied."""
        return self.hardware_skew.apply(self.deployment)


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
