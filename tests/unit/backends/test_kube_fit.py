"""Scaling to what fits (slotune.backends.kube_fit): which pods count as placed, the patch, and when a later deploy
keeps the fitted count (same generation, same request) or asks for the full count again (a spec change)."""

from __future__ import annotations

from slotune.backends import kube_fit
from slotune.controller.status import readiness


def pod(scheduled: bool, deleting: bool = False) -> dict:
    meta = {"name": "p", **({"deletionTimestamp": "2026-12-05T00:00:00Z"} if deleting else {})}
    return {"metadata": meta, "status": {"conditions": [
        {"type": "PodScheduled", "status": "True" if scheduled else "False",
         **({} if scheduled else {"reason": "Unschedulable"})}]}}


def test_only_scheduled_pods_nobody_deletes_fit() -> None:
    pods = [pod(True), pod(True), pod(False), pod(True, deleting=True), {"metadata": {"name": "x"}}]
    result = kube_fit.fit(1024, pods, "unschedulable: Insufficient nvidia.com/gpu")
    assert (result.requested, result.fits) == (1024, 2)
    assert "scaled to 2 of 1024 requested replicas" in result.message()
    assert "Insufficient nvidia.com/gpu" in result.message()
    assert kube_fit.fit(3, [pod(True)] * 5, "").fits == 3  # never more than asked


def test_the_patch_scales_down_and_records_the_request() -> None:
    patch = kube_fit.fit_patch(kube_fit.Fit(1024, 0, "r"), generation=3)
    assert patch == {"metadata": {"annotations": {kube_fit.REQUESTED_ANNOTATION: "1024",
                                                  kube_fit.FITTED_GENERATION_ANNOTATION: "3"}},
                     "spec": {"replicas": 0}}


def deployment(replicas: int, requested: int, generation: int | None) -> dict:
    annotations = {kube_fit.REQUESTED_ANNOTATION: str(requested)}
    if generation is not None:
        annotations[kube_fit.FITTED_GENERATION_ANNOTATION] = str(generation)
    return {"metadata": {"annotations": annotations}, "spec": {"replicas": replicas},
            "status": {"replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas,
                       "availableReplicas": replicas}}


def test_a_redeploy_of_the_same_generation_keeps_the_fitted_count() -> None:
    fitted = deployment(2, 1024, generation=3)
    assert kube_fit.fitted_replicas(fitted, 1024, generation=3) == 2  # an operator restart resuming it
    assert kube_fit.fitted_replicas(fitted, 1024, generation=4) == 1024  # a spec change asks again
    assert kube_fit.fitted_replicas(fitted, 8, generation=3) == 8  # another count than the one that did not fit
    assert kube_fit.fitted_replicas(deployment(2, 2, None), 2, generation=3) == 2
    assert kube_fit.fitted_replicas(None, 5, generation=1) == 5


def test_readiness_says_the_deployment_was_scaled_to_fit() -> None:
    ready, message = readiness(deployment(2, 1024, generation=1))
    assert ready and message == "2/2 pods ready (scaled to fit: 1024 requested)"
    assert readiness(deployment(2, 2, None))[1] == "2/2 pods ready"
