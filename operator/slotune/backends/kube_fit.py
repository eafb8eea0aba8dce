"""Nothing stays pending: a runtime Deployment whose pods cannot be placed is scaled to what fits.

A TunedModel asking for more than the cluster has (1,024 replicas of 8 GPUs, a ResourceQuota's pod count) left its
Deployment at the requested count: the pods that could not be scheduled (or created) stayed Pending in the
scheduler's queue until someone deleted them. Once the rollout's unschedulable grace has passed, the Deployment is
scaled to the pods that are placed (scheduled, not terminating; zero when none is), and says so: an event, the
rollout's failure message (the TunedModel's status goes Degraded with it) and two annotations on the Deployment.

The requested count is kept: the `slotune.io/config` annotation and the status' config still carry it, and
`slotune.io/requested-replicas` names it beside the fitted count. A later deploy of the same TunedModel generation
(an operator restart resuming it) keeps the fitted count instead of queueing the same Pending pods again; a new
generation (any spec change) asks for its full count again.

A freed cluster (a quota raised, a node added) takes the request back without a spec change: each fit sets a retry
time (`slotune.io/fit-retry-at`, wall clock, so an operator restart keeps it), the first one `FitBackoff.first_s`
after it, doubling per retry that did not fit up to `max_s`. When it is due the Deployment is scaled to the requested
count again; pods still unplaceable after the grace are fitted again (a Pending pod never outlives the grace), and
the count of retries (`slotune.io/fit-retries`) goes back to zero once the full count is running.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slotune.settings import OperatorSettings

REQUESTED_ANNOTATION = "slotune.io/requested-replicas"
FITTED_GENERATION_ANNOTATION = "slotune.io/fitted-generation"  # the TunedModel generation whose pods did not fit
RETRY_AT_ANNOTATION = "slotune.io/fit-retry-at"  # when the requested count is asked for again (RFC 3339, UTC)
RETRIES_ANNOTATION = "slotune.io/fit-retries"  # retries since the full count last ran: the backoff's exponent


@dataclass(frozen=True)
class FitBackoff:
    first_s: float  # after the first fit
    max_s: float  # the cap: a cluster freed for good is taken back within this long

    @classmethod
    def of(cls, settings: OperatorSettings) -> FitBackoff:
        return cls(settings.fit_retry_s, settings.fit_retry_max_s)

    def delay_s(self, retries: int) -> float:
        """Seconds from a fit to the next retry, after `retries` retries that did not fit."""
        return min(self.first_s * 2 ** min(retries, 32), self.max_s)


@dataclass(frozen=True)
class Fit:
    requested: int
    fits: int
    reason: str  # why the others did not fit (the pod's Unschedulable message, the quota's FailedCreate)
    retries: int = 0  # retries made since the full count last ran
    retry_at_s: float | None = None  # unix seconds of the next retry

    def message(self) -> str:
        # The reason ends a sentence: Kubernetes' messages repeat their last words ("... not found. not found"),
        # which the status drops sentence by sentence (controller.status.readable).
        again = "on the next spec change" if self.retry_at_s is None else \
            f"at {_timestamp(self.retry_at_s)} (retry {self.retries + 1}) or on the next spec change"
        return (f"scaled to {self.fits} of {self.requested} requested replicas, no pod left Pending: "
                f"{self.reason.rstrip('. ')}. The requested count stays in status.config.replicas and is asked for "
                f"again {again}")


def placed(pod: dict[str, Any]) -> bool:
    """A pod the scheduler bound to a node (it holds its resources) and nobody is deleting."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "True" for c in conditions)


def fit(requested: int, pods: list[dict[str, Any]], reason: str, deployment: dict[str, Any] | None = None,
        backoff: FitBackoff | None = None, now_s: float = 0.0) -> Fit:
    """What fits of `requested`, and (given a backoff) when to ask for it again: the Deployment's retry count says
    how many retries did not fit before this one."""
    retries = _retries(deployment)
    at = None if backoff is None else now_s + backoff.delay_s(retries)
    return Fit(requested, min(requested, sum(1 for p in pods if placed(p))), reason, retries, at)


def fit_patch(result: Fit, generation: int) -> dict[str, Any]:
    """The merge patch that scales the Deployment down and records what was asked (the pod template is untouched,
    so the pods that fit keep running)."""
    annotations = {REQUESTED_ANNOTATION: str(result.requested), FITTED_GENERATION_ANNOTATION: str(generation)}
    if result.retry_at_s is not None:
        annotations |= {RETRY_AT_ANNOTATION: _timestamp(result.retry_at_s), RETRIES_ANNOTATION: str(result.retries)}
    return {"metadata": {"annotations": annotations}, "spec": {"replicas": result.fits}}


def retry_patch(deployment: dict[str, Any] | None, replicas: int, now_s: float) -> dict[str, Any] | None:
    """The merge patch that asks for the requested `replicas` again, where the Deployment was fitted from that
    request and its retry is due; None otherwise. No longer marked fitted, a redeploy keeps the full count too."""
    annotations = _annotations(deployment)
    if annotations.get(REQUESTED_ANNOTATION) != str(replicas) or _replicas(deployment, replicas) >= replicas:
        return None
    at = annotations.get(RETRY_AT_ANNOTATION)
    if at is None and FITTED_GENERATION_ANNOTATION not in annotations:
        return None
    if at is not None and datetime.fromisoformat(at).timestamp() > now_s:  # none: fitted before retries existed
        return None
    return {"metadata": {"annotations": {FITTED_GENERATION_ANNOTATION: None, RETRY_AT_ANNOTATION: None,
                                         RETRIES_ANNOTATION: str(_retries(deployment) + 1)}},
            "spec": {"replicas": replicas}}


def reset_patch(deployment: dict[str, Any] | None) -> dict[str, Any] | None:
    """The merge patch that forgets the retries once the full requested count runs; None when there is none."""
    annotations = _annotations(deployment)
    if RETRIES_ANNOTATION not in annotations and RETRY_AT_ANNOTATION not in annotations:
        return None
    requested = int(annotations.get(REQUESTED_ANNOTATION, 0))
    if _replicas(deployment, requested) < requested:
        return None
    return {"metadata": {"annotations": {RETRIES_ANNOTATION: None, RETRY_AT_ANNOTATION: None}}}


def fitted_replicas(deployment: dict[str, Any] | None, replicas: int, generation: int) -> int:
    """The replica count a deploy of `replicas` should apply: the fitted count where this same generation was
    scaled to fit and asks for the same count again, else `replicas`."""
    annotations = _annotations(deployment)
    if annotations.get(FITTED_GENERATION_ANNOTATION) != str(generation):
        return replicas
    if annotations.get(REQUESTED_ANNOTATION) != str(replicas):
        return replicas
    return min(replicas, _replicas(deployment, replicas))


def _annotations(deployment: dict[str, Any] | None) -> dict[str, str]:
    return ((deployment or {}).get("metadata") or {}).get("annotations") or {}


def _replicas(deployment: dict[str, Any] | None, default: int) -> int:
    return int(((deployment or {}).get("spec") or {}).get("replicas", default))


def _retries(deployment: dict[str, Any] | None) -> int:
    return int(_annotations(deployment).get(RETRIES_ANNOTATION, 0))


def _timestamp(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
