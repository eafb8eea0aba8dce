"""Kubernetes Events on a TunedModel: one for every change slotune makes, with the reason.

`transition_events` turns two consecutive loop states into (reason, message, warning) triples (a change decided, kept,
rolled back or failed; a phase reached); `EventRecorder` posts them as core/v1 Events through the operator's API
client. Messages never carry the admin token or any other secret: they are built from configs and measurements.
"""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime
from typing import Any

from slotune.api import API_VERSION, KIND, Phase, TunedModel, Verdict
from slotune.backends.kube_api import KubeAPI, KubeError, object_path
from slotune.controller.status import readable
from slotune.loop.state import HistoryRecord, TuningState
from slotune.metrics.window import UnavailableReason

log = logging.getLogger(__name__)
COMPONENT = "slotune-operator"
_WARNING_VERDICTS = frozenset({Verdict.ROLLED_BACK, Verdict.FAILED})
_VERDICT_REASONS = {Verdict.KEPT: "ChangeKept", Verdict.ROLLED_BACK: "ChangeRolledBack", Verdict.FAILED: "ChangeFailed",
                    Verdict.BASELINE: "Baseline", Verdict.PENDING: "ChangePending",
                    Verdict.WORKLOAD_SHIFT: "WorkloadShift"}
_PHASE_REASONS = {Phase.CONVERGED: "Converged", Phase.INFEASIBLE: "Infeasible", Phase.DEGRADED: "Degraded",
                  Phase.MEASURING: "Measuring"}


def _history_event(entry: HistoryRecord) -> tuple[str, str, bool]:
    before = entry.before.ttft.p99_ms if entry.before else None
    after = entry.after.ttft.p99_ms if entry.after else None
    numbers = f" (TTFT P99 {_ms(before)} -> {_ms(after)})" if entry.after else ""
    detail = f": {entry.detail}" if entry.detail else ""
    message = f"{entry.change}{numbers}{detail}"
    return _VERDICT_REASONS[entry.verdict], message, entry.verdict in _WARNING_VERDICTS


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


def transition_events(before: TuningState | None, after: TuningState) -> list[tuple[str, str, bool]]:
    """What happened between two saved states, oldest first."""
    found: list[tuple[str, str, bool]] = []
    known = {(h.iteration, h.change, h.verdict) for h in before.history} if before else set()
    found += [_history_event(h) for h in after.history if (h.iteration, h.change, h.verdict) not in known]
    pending_before = before.pending if before else None
    if after.pending is not None and (pending_before is None or pending_before.config != after.pending.config):
        found.append(("ChangeDecided", f"trying {after.pending.change}: {after.pending.proposal.reason}", False))
    if before is None or before.phase is not after.phase:
        reason = _PHASE_REASONS.get(after.phase, after.phase.value)
        warning = after.phase in (Phase.DEGRADED, Phase.INFEASIBLE)
        found.append((reason, f"phase {after.phase.value}: {after.message}", warning))
    if before is not None and before.measured.metrics_available and not after.measured.metrics_available \
            and not _quiet_start(before, after):
        found.append(("MetricsUnavailable", after.message, True))
    return found


def _quiet_start(before: TuningState, after: TuningState) -> bool:
    """Too few requests before any window was measured: the normal start (no traffic yet), not a loss of metrics; the
    MetricsAvailable condition says it (Unknown)."""
    measured = before.measured.observed is not None or bool(before.history)
    return not measured and UnavailableReason.TOO_FEW_SAMPLES.value in after.message


class EventRecorder:
    def __init__(self, api: KubeAPI, tm: TunedModel) -> None:
        self.api = api
        self.namespace = tm.metadata.namespace or "default"
        self.involved = {"apiVersion": API_VERSION, "kind": KIND, "name": tm.metadata.name,
                         "namespace": self.namespace, "uid": (tm.metadata.model_extra or {}).get("uid")}

    def __call__(self, reason: str, message: str, warning: bool = False) -> None:
        message = readable(message)
        log.info("%s/%s %s: %s", self.namespace, self.involved["name"], reason, message)
        try:
            self.api.post(object_path("Event", self.namespace), self.body(reason, message, warning))
        except (KubeError, OSError) as error:  # an event lost must not stop tuning
            log.warning("could not post event %s: %s", reason, error)

    def body(self, reason: str, message: str, warning: bool) -> dict[str, Any]:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{self.involved['name']}.", "namespace": self.namespace},
            "involvedObject": self.involved, "reason": reason, "message": message[:1024],
            "type": "Warning" if warning else "Normal", "source": {"component": COMPONENT},
            "reportingComponent": f"slotune.io/{COMPONENT}", "reportingInstance": socket.gethostname(),
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
