"""A TunedModel's status on the API server: conditions, phase, observed window, history, and the loop's own state.

`status_body` renders the user-facing status (slotune.loop's `TuningState.to_status()` plus the five conditions);
`StatusStateStore` is the loop's `StateStore` on Kubernetes: it writes that body through the status subresource
together with the full `TuningState` as a JSON string under `status.kopf.slotuneState` (the one field the CRD's
structural schema leaves open, `x-kubernetes-preserve-unknown-fields`), keyed by the spec generation it was tuned
for, so a restarted operator resumes where the last one stopped and a changed spec starts over. The store is the
only writer of that state, so it reads it from the API server once and answers later loads from memory: a tick
that has nothing to do costs no request.

What a person reads is held to their terms: each condition's status, reason and message say the same thing (Ready is
the pods being ready, `readiness`; `refresh` rewrites the conditions when that changes between two saves),
MetricsAvailable is Unknown until a window was measured, numbers are rounded (`kubectl get tm` prints 7400, not
7399.999999999999), and messages relayed from Kubernetes lose the sentences they repeat (`readable`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slotune.api import Condition, ConditionStatus, ConditionType, Phase, TunedModel
from slotune.backends.kube_api import KubeAPI, object_path
from slotune.backends.kube_deployment import rollout_state
from slotune.loop.state import TuningState
from slotune.manifests.admission import REFUSED
from slotune.metrics.window import UnavailableReason

STATE_KEY = "slotuneState"
_TUNING_PHASES = frozenset({Phase.MEASURING, Phase.TUNING, Phase.VERIFYING})


@dataclass(frozen=True)
class Health:
    """What the loop's state does not say: is the Deployment serving, and why metrics are missing."""

    ready: bool
    ready_message: str = ""
    metrics_reason: UnavailableReason | None = None
    no_prometheus: bool = False
    tuning_enabled: bool = True


def readiness(deployment: dict[str, Any] | None) -> tuple[bool, str]:
    """(ready, message) of the runtime Deployment. Ready means what a user asks of it: every wanted replica has a
    ready pod (a rollout may still be replacing them; the message says so), so the flag and the numbers agree."""
    if deployment is None:
        return False, "no Deployment yet"
    wanted = deployment.get("spec", {}).get("replicas", 0)
    ready = deployment.get("status", {}).get("readyReplicas", 0)
    rollout = rollout_state(deployment)
    counted = f"{ready}/{wanted} pods ready"
    if rollout.problem or rollout.blocked:
        return ready >= wanted > 0, f"{counted}; {rollout.problem or rollout.blocked}"
    if rollout.done:
        return ready >= wanted > 0, counted
    return ready >= wanted > 0, f"{counted}, rollout in progress ({rollout.progress})"


def readable(message: str) -> str:
    """`message` without sentences it already said: messages relayed from Kubernetes repeat themselves (the scheduler
    writes 'persistentvolumeclaim "models" not found. not found')."""
    kept: list[str] = []
    for sentence in (part.strip() for part in message.split(". ")):
        if sentence and not any(sentence.rstrip(".") in earlier for earlier in kept):
            kept.append(sentence)
    return ". ".join(kept)


def _status(flag: bool | None) -> ConditionStatus:
    return ConditionStatus.UNKNOWN if flag is None else ConditionStatus.TRUE if flag else ConditionStatus.FALSE


def _metrics(state: TuningState, health: Health) -> tuple[bool | None, str, str]:
    """MetricsAvailable: False when they cannot be read, Unknown until a window was measured, True after."""
    if health.no_prometheus:
        return False, "NoPrometheus", "no Prometheus URL is configured: tuning is paused"
    if not state.metrics_available:
        # Too few requests before any window was measured is the normal start (no traffic yet): not known yet.
        unknown = state.observed is None and health.metrics_reason is UnavailableReason.TOO_FEW_SAMPLES
        return None if unknown else False, _metrics_reason(health), state.message
    if state.observed is None:
        return None, "NoWindowYet", "no measurement window has been judged yet"
    return True, "WindowMeasured", f"last window: {state.observed.num_requests} requests"


def _metrics_reason(health: Health) -> str:
    return {UnavailableReason.TOO_FEW_SAMPLES: "TooFewSamples", UnavailableReason.NOT_EXPOSED: "NoSeries",
            UnavailableReason.UNREACHABLE: "PrometheusUnreachable"}.get(health.metrics_reason, "Unavailable")


def wanted_conditions(state: TuningState, health: Health) -> list[tuple[ConditionType, bool | None, str, str]]:
    """(type, status, reason, message) of each condition, derived from the state and the Deployment's health."""
    tuning = health.tuning_enabled and state.phase in _TUNING_PHASES
    tuning_reason = "Off" if not health.tuning_enabled else state.phase.value
    degraded = state.phase is Phase.DEGRADED
    slo_reason = "Unmeasured" if state.slo_met is None else "TargetsMet" if state.slo_met else "TargetsMissed"
    message = readable(state.message)
    return [
        (ConditionType.READY, health.ready, "PodsReady" if health.ready else "PodsNotReady",
         readable(health.ready_message)),
        (ConditionType.SLO_MET, state.slo_met, slo_reason, _slo_message(state)),
        (ConditionType.TUNING, tuning, tuning_reason, message),
        (ConditionType.METRICS_AVAILABLE, *_metrics(state, health)),
        (ConditionType.DEGRADED, degraded, _degraded_reason(state), message if degraded else ""),
    ]


def _degraded_reason(state: TuningState) -> str:
    if state.phase is not Phase.DEGRADED:
        return "Healthy"
    return "PolicyRefused" if REFUSED in state.message else "ChangeFailed"


def _slo_message(state: TuningState) -> str:
    if state.observed is None:
        return "no window measured yet"
    ttft, tpot = state.observed.ttft.p99_ms, state.observed.tpot.p99_ms
    return f"last window: {state.observed.num_requests} requests, TTFT P99 {_ms(ttft)}, TPOT P99 {_ms(tpot)}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def conditions(state: TuningState, health: Health, previous: list[Condition], generation: int | None,
               now: datetime) -> list[Condition]:
    """The conditions, keeping lastTransitionTime where a condition's status did not change."""
    before = {c.type: c for c in previous}
    found = []
    for kind, flag, reason, message in wanted_conditions(state, health):
        status = _status(flag)
        old = before.get(kind)
        since = old.last_transition_time if old is not None and old.status is status else now
        found.append(Condition(type=kind, status=status, reason=reason, message=message[:32768],
                               last_transition_time=since, observed_generation=generation))
    return found


def status_body(state: TuningState, health: Health, previous: list[Condition], generation: int | None,
                now: datetime | None = None) -> dict[str, Any]:
    """The status subresource's content for `state` (wire form, camelCase), conditions included."""
    old = previous
    status = state.to_status().model_copy(update={
        "observed_generation": generation,
        "conditions": conditions(state, health, old, generation, now or datetime.now(UTC)),
    })
    body = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    body["message"] = readable(body.get("message", ""))
    for entry in (body.get("observed"), *(h.get(k) for h in body.get("history", []) for k in ("before", "after"))):
        if entry:
            _round_observed(entry)
    # A merge patch leaves absent keys alone: say explicitly what is gone, so status never shows a stale value.
    for key in ("observed", "diagnosis", "bestConfig", "sloMet", "canary"):
        body.setdefault(key, None)
    return body


def _shown(condition: Condition) -> tuple[str, str, str, str]:
    return condition.type.value, condition.status.value, condition.reason, condition.message


_FRACTIONS = frozenset({"prefixCacheHitRate", "specAcceptanceRate", "kvCacheUsage"})


def _round_observed(observed: dict[str, Any]) -> None:
    """Milliseconds, seconds and rates to 0.1, fractions to 0.001: what `kubectl get tm` prints is read by a person
    (7400.0, not 7399.999999999999), and no decision reads these fields back (the loop keeps its own state)."""
    for key, value in observed.items():
        if isinstance(value, dict):
            observed[key] = {k: round(v, 1) if isinstance(v, float) else v for k, v in value.items()}
        elif isinstance(value, float):
            observed[key] = round(value, 3 if key in _FRACTIONS else 1)


class StatusStateStore:
    """The loop's StateStore, kept in the TunedModel's status. `health` is read at every save."""

    def __init__(self, api: KubeAPI, tm: TunedModel, health: Callable[[], Health],
                 on_saved: Callable[[TuningState | None, TuningState], None] | None = None,
                 status: dict[str, Any] | None = None) -> None:
        """`status`: the TunedModel's status as the operator's watch last delivered it (kopf's body), read instead
        of a GET when the store starts: a create's two GETs (the saved state, the conditions) were 2,000 requests of
        a 1,000-create burst that the API server serves at ~40 a second."""
        self.api = api
        self._status = status
        self.namespace = tm.metadata.namespace or "default"
        self.name = tm.metadata.name
        self.generation = tm.metadata.generation
        self._health = health
        self._on_saved = on_saved or (lambda before, after: None)
        self._last: TuningState | None = None
        self._written: list[Condition] = []  # the conditions last written, to skip a refresh that changes nothing
        self._body: dict[str, Any] | None = None  # the status last written by save

    @property
    def path(self) -> str:
        return object_path("TunedModel", self.namespace, self.name) + "/status"

    def _read(self) -> dict[str, Any]:
        if self._status is not None:  # what the watch delivered, until this store writes its own
            return self._status
        found = self.api.get(object_path("TunedModel", self.namespace, self.name))
        return (found or {}).get("status") or {}

    def load(self) -> TuningState | None:
        if self._last is not None:
            return self._last
        saved = ((self._read().get("kopf") or {}).get(STATE_KEY)) or {}
        if not saved or saved.get("generation") != self.generation:
            return None  # never tuned, or tuned for an older spec: start over
        self._last = TuningState.from_json(saved["state"])
        return self._last

    def save(self, state: TuningState) -> None:
        # The conditions this store last wrote are the live ones (only slotune writes them): a GET per save only
        # after a restart. At 1,000 TunedModels that is a thousand GETs a window the API server is spared.
        previous = self._written or [Condition.model_validate(c) for c in self._read().get("conditions") or []]
        body = status_body(state, self._health(), previous, self.generation)
        body["kopf"] = {STATE_KEY: {"generation": self.generation, "state": state.to_json()}}
        if body != self._body:  # the same status again (a tick that changed nothing) is not written
            self._status = None
            self.api.merge_patch(self.path, {"status": body})
            self._body = body
        self._written = [Condition.model_validate(c) for c in body["conditions"]]
        before, self._last = self._last, state
        self._on_saved(before, state)

    def last(self) -> TuningState | None:
        return self._last

    def refresh(self) -> bool:
        """Rewrite the conditions when the Deployment's health changed since the last save (pods turning ready
        while the loop waits out a window), without a write when nothing changed; returns whether the pods are
        ready, so the caller knows to look again soon."""
        if self._last is None:
            return True
        health = self._health()
        wanted = conditions(self._last, health, self._written, self.generation, datetime.now(UTC))
        if [_shown(c) for c in wanted] != [_shown(c) for c in self._written]:
            body = [c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in wanted]
            self._status = None
            self.api.merge_patch(self.path, {"status": {"conditions": body}})
            self._written, self._body = wanted, None
        return health.ready

    def report_fault(self, message: str) -> None:
        """Degraded=True (reason TickFailed) without touching the saved state; the next save recomputes it."""
        previous = [Condition.model_validate(c) for c in self._read().get("conditions") or []]
        now = datetime.now(UTC)
        kept = [c for c in previous if c.type is not ConditionType.DEGRADED]
        since = next((c.last_transition_time for c in previous if c.type is ConditionType.DEGRADED
                      and c.status is ConditionStatus.TRUE), now)
        fault = Condition(type=ConditionType.DEGRADED, status=ConditionStatus.TRUE, reason="TickFailed",
                          message=readable(message)[:32768], last_transition_time=since,
                          observed_generation=self.generation)
        conditions = [*kept, fault]
        body = [c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in conditions]
        self._status = None
        self.api.merge_patch(self.path, {"status": {"conditions": body}})
        self._written, self._body = conditions, None

