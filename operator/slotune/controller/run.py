"""One TunedModel's life in the operator: deploy its children, then drive slotune.loop's Tuner tick by tick.

`deploy` is what the create/update/resume handlers do; `TuningRun` is what the per-resource daemon does: each `tick`
is one short, non-blocking `Tuner.step()` (no sleep inside: a rollout in progress or a window still open ends it) and
returns how long the daemon may sleep before the next tick has work. The Tuner's state lives in the status
(StatusStateStore), so a new operator picks up where the old one stopped; a new spec generation starts a new run.
A tick that raises is the daemon's to report (`report_fault`): the state saved before it stands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from slotune.api import TunedModel, TunedModelSpec, TuningMode
from slotune.backends.kube_api import KubeAPI
from slotune.backends.kube_canary_start import CanaryStart
from slotune.backends.kube_deployment import KubernetesBackend
from slotune.controller import telemetry
from slotune.controller.events import EventRecorder, transition_events
from slotune.controller.measure import PromQLSource
from slotune.controller.status import Health, StatusStateStore, readiness
from slotune.controller.windows import Readings, SharedWindows
from slotune.knobs import RuntimeConfig
from slotune.loop import ApplyResult, Tuner, TuningProblem, TuningState
from slotune.manifests.resources import RUNTIME_PORT
from slotune.perfmodel.model_profile import LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_2_1B, MODELS, ModelProfile
from slotune.quality import QualityGate
from slotune.quality.gate import in_background
from slotune.settings import OperatorSettings

log = logging.getLogger(__name__)
# How often a TunedModel's children are looked at besides the loop's own steps (a deleted admin Secret to rotate,
# pods turning ready while the loop waits out a window): two GETs, so not on every tick of a thousand idle models.
LOOK_S = 10.0
# A rollout in flight is looked at after 2, 4, 8 ... s, at most LOOK_S apart, while nothing changes: a thousand
# TunedModels rolling out at once (a create storm) polled every tick would be a thousand GETs every two seconds, and
# the API server they wait on is the one that must create the next TunedModels' children.
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
    rolled out is kept, so an operator restart never restarts pods. Raises ChildRefused when the API server refuses
    a child (the spec cannot be deployed as written)."""
    backend = KubernetesBackend(api, tm, settings)
    config = None if restart_tuning else backend.deployed_config()
    config = config or tm.spec.initial_config()
    backend.deploy(config)
    EventRecorder(api, tm)("Deployed", f"applied Deployment, Service and Secret for {config.describe()}")
    return config


class TuningRun:
    def __init__(self, api: KubeAPI, tm: TunedModel, settings: OperatorSettings, windows: SharedWindows,
                 clock: Callable[[], float] = time.time, status: dict[str, Any] | None = None) -> None:
        """`status`: the TunedModel's status as the operator's watch holds it (None: read from the API server)."""
        self.tm = tm
        self.settings = settings
        self.generation = tm.metadata.generation
        self.events = EventRecorder(api, tm)
        self._clock = clock
        self.backend = KubernetesBackend(api, tm, settings, record=self.events)
        self.changed_at_s = 0.0
        self._looked_at_s = float("-inf")  # when the children were last looked at besides the loop (LOOK_S)
        self._ready = True
        self._last_fault: str | None = None
        self._polls = 0  # ticks in a row with an apply in flight and nothing saved
        quality = QualityGate(tm.spec.quality, self._openai_urls, tm.spec.model.name, submit=in_background,
                              clock=clock)
        self.source = PromQLSource(tm, settings, lambda: self.changed_at_s, windows, clock,
                                   quiet_since_s=lambda: quality.probed_until_s)
        self.store = StatusStateStore(api, tm, self.health, on_saved=self._saved, status=status)
        problem = TuningProblem.from_spec(tm.spec, profile_for(tm.spec))
        self.tuner = Tuner(problem, _Timed(self), self.source, self.store, clock, quality=quality)

    def _openai_urls(self) -> list[str]:
        """The ready pods' OpenAI endpoints, where the quality gate asks its probe set (slotune.quality); the test
        harness's pod endpoints file wins. Pods reachable only through the API server's proxy: the gate fails closed."""
        listed = self.settings.pod_endpoints()
        return [listed.get(f"{self.backend.namespace}/{pod['metadata']['name']}")
                or f"http://{pod['status'].get('podIP')}:{RUNTIME_PORT}" for pod in self.backend.ready_pods()]

    def health(self) -> Health:
        ready, message = readiness(self.backend.deployment())
        return Health(ready=ready, ready_message=message, metrics_reason=self.source.last_reason,
                      no_prometheus=not self.settings.prometheus_url,
                      tuning_enabled=self.tm.spec.tuning.mode is not TuningMode.OFF)

    def _saved(self, before: TuningState | None, after: TuningState) -> None:
        for reason, message, warning in transition_events(before, after):
            self.events(reason, message, warning)

    def pending_read(self) -> Future[Readings] | None:
        """The shared read of the window the loop waits for, once the window has ended and until it answered: the
        daemon awaits it on the event loop, so a tick takes a worker only when its readings are in (at 1,000
        TunedModels three ticks a window each held a worker, two of them only to find the read still in flight)."""
        return self.source.pending()

    def tick(self) -> float:
        """One short step of the loop; returns the seconds until the next step has something to do."""
        with self.backend.one_look():
            return self._tick()

    def _tick(self) -> float:
        look = self._clock() - self._looked_at_s >= LOOK_S
        if look:
            self._looked_at_s = self._clock()
            self.backend.rotate_deleted_token()  # before the step: a hot change needs the token
        before = self.store.last()
        self.tuner.step()
        self._last_fault = None
        if look:  # Ready follows the pods even while the loop waits out a window
            self._ready = self.store.refresh()
        wake_at_s = self.tuner.wake_at_s
        telemetry.TICKS.labels("poll" if wake_at_s is None else "window").inc()
        if look:
            telemetry.TICKS_LOOKED.inc()
        if wake_at_s is None:  # a rollout, a retry or an apply in flight: look again soon, less often if idle
            self._polls = 0 if self.store.last() is not before else self._polls + 1
            return min(self.settings.tick_s * 2 ** min(self._polls, 16), max(self.settings.tick_s, LOOK_S))
        self._polls = 0
        delay = max(self.settings.tick_s, wake_at_s - self._clock())
        return delay if self._ready else min(delay, LOOK_S)

    def report_fault(self, error: BaseException) -> None:
        """A tick raised: say so on the TunedModel (Warning event, Degraded condition) and keep the saved state.
        The same cause again, retry after retry, is said once."""
        cause = f"{type(error).__name__}: {error}"
        if cause == self._last_fault:
            return
        self.events("TickFailed", f"tuning step failed, retrying with backoff: {cause}", True)
        self.store.report_fault(f"tuning step failed, retrying: {cause}")
        self._last_fault = cause


class _Timed:
    """The backend as the Tuner sees it, noting when what runs last changed (windows start after its warm-up)."""

    def __init__(self, run: TuningRun) -> None:
        self.run = run

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        result = self.run.backend.apply(config)
        if result.changed:
            self.run.changed_at_s = self.run._clock()
        return result

    def ready(self) -> bool:
        return self.run.backend.ready()

    def retry_fit(self, config: RuntimeConfig) -> str | None:
        retried = self.run.backend.retry_fit(config)
        if retried is not None:
            self.run.changed_at_s = self.run._clock()
        return retried

    def start_canary(self, running: RuntimeConfig, candidate: RuntimeConfig) -> CanaryStart | None:
        started = self.run.backend.start_canary(running, candidate)
        if started is not None and started.result.changed:
            self.run.changed_at_s = self.run._clock()  # the canary window starts after its warm-up too
        return started

    def end_canary(self) -> None:
        self.run.backend.end_canary()
