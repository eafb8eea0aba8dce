"""Nothing stays pending: a runtime Deployment whose pods cannot be placed is scaled to what fits.

A TunedModel asking for more than the cluster has (1,024 replicas of 8 GPUs, a ResourceQuota's pod count) left its
Deployment at the requested count: the pods that could not be scheduled (or created) stayed Pending in the
scheduler's queue until someone deleted them. Once the rollout's unschedulable grace has passed, the Deployment is
scaled to the pods that are placed (scheduled, not terminating; zero when none is), and says so: an event, the
rollout's failure message (the TunedModel's status goes Degraded with it) and two annotations on the Deployment.

The requested count is kept: the `slotune.io/config` annotation and the status' config still carry it, and
`slotune.io/requested-replicas` names it beside the fitted count. A later deploy of the same TunedModel generation
(an operator restart resuming it) keeps the fitted count instead of queueing the same Pending pods again; a new
generation (any spec change) asks for its full count again, so a cluster freed since can take it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUESTED_ANNOTATION = "slotune.io/requested-replicas"
FITTED_GENERATION_ANNOTATION = "slotune.io/fitted-generation"  # the TunedModel generation whose pods did not fit


@dataclass(frozen=True)
class Fit:
    requested: int
    fits: int
    reason: str  # why the others did not fit (the pod's Unschedulable message, the quota's FailedCreate)

    def message(self) -> str:
        # The reason ends a sentence: Kubernetes' messages repeat their last words ("... not found. not found"),
        # which the status drops sentence by sentence (controller.status.readable).
        return (f"scaled to {self.fits} of {self.requested} requested replicas, no pod left Pending: "
                f"{self.reason.rstrip('. ')}. The requested count stays in status.config.replicas and is asked for "
                "again on the next spec change")


def placed(pod: dict[str, Any]) -> bool:
    """A pod the scheduler bound to a node (it holds its resources) and nobody is deleting."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "True" for c in conditions)


def fit(requested: int, pods: list[dict[str, Any]], reason: str) -> Fit:
    return Fit(requested, min(requested, sum(1 for p in pods if placed(p))), reason)


def fit_patch(result: Fit, generation: int) -> dict[str, Any]:
    """The merge patch that scales the Deployment down and records what was asked (the pod template is untouched,
    so the pods that fit keep running)."""
    return {"metadata": {"annotations": {REQUESTED_ANNOTATION: str(result.requested),
                                         FITTED_GENERATION_ANNOTATION: str(generation)}},
            "spec": {"replicas": result.fits}}


def fitted_replicas(deployment: dict[str, Any] | None, replicas: int, generation: int) -> int:
    """The replica count a deploy of `replicas` should apply: the fitted count where this same generation was
    scaled to fit and asks for the same count again, else `replicas`."""
    meta = (deployment or {}).get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if annotations.get(FITTED_GENERATION_ANNOTATION) != str(generation):
        return replicas
    if annotations.get(REQUESTED_ANNOTATION) != str(replicas):
        return replicas
    return min(replicas, int(((deployment or {}).get("spec") or {}).get("replicas", replicas)))
