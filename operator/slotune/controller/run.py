"""One TunedModel's life in the operator: deploy its children, then drive slotune.loop's Tuner tick by tick.

`deploy` is what the create/update/resume handlers do; `TuningRun` is what the per-resource daemon does: each tick
checks readiness (re-sending live config to new pods), then either advances the Tuner (tuning.mode online or
benchmark) or only measures and reports (mode off). The Tuner's state lives in the status (StatusStateStore), so a
new operator picks up where the old one stopped; a new spec generation starts a new run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from slotune.api import Observed, Phase, TunedModel, TunedModelSpec, TuningMode
from slotune.backends.kube_api import KubeAPI
from slotune.backends.kubernetes import KubernetesBackend
from slotune.controller.events import EventRecorder, transition_events
from slotune.controller.measure import PromQLSource
from slotune.controller.status import Health, StatusStateStore
from slotune.knobs import RuntimeConfig
from slotune.loop import ApplyResult, MetricsUnavailable, Tuner, TuningProblem, TuningState
from slotune.perfmodel.model_profile import LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_2_1B, MODELS, ModelProfile
from slotune.settings import OperatorSettings

log = logging.getLogger(__name__)
_BY_SIZE = (("70b", LLAMA_3_1_70B), ("8b", LLAMA_3_1_8B), ("1b", LLAMA_3_2_1B))


def profile_for(spec: TunedModelSpec) -> ModelProfile:
    """The performance model's view of the served model: a known profile by preset or name, else by size in the name
    (the operator never downloads a checkpoint to read its config.json), else Llama-3.1-8B's shape."""
    preset = spec.model.source.removeprefix("builtin://")
    for key in (preset, spec.model.name):
        if key in MODELS:
            return MODELS[key]
    text = f"{spec.model.source} {spec.model.name}".lower()
    return next((profile for size, profile in _BY_SIZE if size in text), LLAMA_3_1_8B)


def deploy(api: KubeAPI, tm: TunedModel, settings: OperatorSettings, restart_tuning: bool) -> RuntimeConfig:
    """Apply the children. A new spec (restart_tuning) deploys its starting config; otherwise the config already
    rolled out is kept, so an operator restart never restarts pods."""
    events = EventRecorder(api, tm)
    backend = KubernetesBackend(api, tm, settings, record=events)
    config = None if restart_tuning else backend.deployed_config()
    config = config or tm.spec.initial_config()
    backend.deploy(config)
    events("Deployed", f"applied Deployment, Service and Secret for {config.describe()}")
    return config


class TuningRun:
    def __init__(self, api: KubeAPI, tm: TunedModel, settings: OperatorSettings, wait: Callable[[float], bool],
                 clock: Callable[[], float] = time.time) -> None:
        self.tm = tm
        self.settings = settings
        self.generation = tm.metadata.generation
        self.events = EventRecorder(api, tm)
        self._ready = False
        self._clock = clock
        self.backend = KubernetesBackend(api, tm, settings, record=self.events, should_stop=lambda: wait(0))
        self.changed_at_s = 0.0
        self.source = PromQLSource(tm, settings, lambda: self.changed_at_s, wait, clock)
        self.store = StatusStateStore(api, tm, self.health, on_saved=self._saved)
        problem = TuningProblem.from_spec(tm.spec, profile_for(tm.spec))
        self.tuner = Tuner(problem, _Timed(self), self.source, self.store, clock)
        self._adopt(self.store.load())

    def _adopt(self, state: TuningState | None) -> None:
        """After a restart: the pods should run what the saved state says is running."""
        if state is None:
            return
        self.backend.live = state.running

    def health(self) -> Health:
        deployment = self.backend.deployment()
        status = (deployment or {}).get("status", {})
        message = f"{status.get('readyReplicas', 0)}/{(deployment or {}).get('spec', {}).get('replicas', 0)} ready"
        return Health(ready=self._ready, ready_message=message, metrics_reason=self.source.last_reason,
                      no_prometheus=not self.settings.prometheus_url,
                      tuning_enabled=self.tm.spec.tuning.mode is not TuningMode.OFF)

    def _saved(self, before: TuningState | None, after: TuningState) -> None:
        for reason, message, warning in transition_events(before, after):
            self.events(reason, message, warning)

    def tick(self) -> TuningState | None:
        self._ready = self.backend.ready()
        if self.tm.spec.tuning.mode is TuningMode.OFF:
            return self.report()
        return self.tuner.step()

    def report(self) -> TuningState:
        """tuning.mode off: measure and report, never change anything."""
        running = self.backend.deployed_config() or self.tm.spec.initial_config()
        state = self.store.load() or TuningState.initial(running)
        state = state.evolve(phase=Phase.MEASURING if self._ready else Phase.DEPLOYING)
        if not self._ready:
            self.store.save(state.evolve(message="waiting for the runtime pods"))
            return state
        try:
            snapshot = self.source.measure(self.tm.spec.tuning.window_s)
        except MetricsUnavailable as error:
            state = state.evolve(metrics_available=False, message=f"tuning off; metrics unavailable: {error}")
        else:
            state = state.evolve(metrics_available=True, observed=Observed.of(snapshot), iteration=state.iteration + 1,
                                 slo_met=self.tm.spec.slo.is_met(snapshot), message="tuning off: reporting only")
        self.store.save(state)
        return state


class _Timed:
    """The backend as the Tuner sees it, noting when the running config last changed (for warm-up windows)."""

    def __init__(self, run: TuningRun) -> None:
        self.run = run

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        result = self.run.backend.apply(config)
        self.run.changed_at_s = self.run._clock()
        return result

    def ready(self) -> bool:
        return self.run.backend.ready()
