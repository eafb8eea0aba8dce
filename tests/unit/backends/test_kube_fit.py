"""Scaling to what fits (slotune.backends.kube_fit): which pods count as placed, the patch, when a later deploy
keeps the fitted count (same generation, same request) or asks for the full count again (a spec change), and the
timed retry: its backoff, when it is due, and when its count starts over."""

from __future__ import annotations

import pytest

from slotune.backends import kube_fit
from slotune.controller.status import readiness
from slotune.settings import load_settings


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


BACKOFF = kube_fit.FitBackoff(first_s=600, max_s=3600)
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def test_the_retry_waits_double_after_each_retry_that_did_not_fit_up_to_the_cap() -> None:
    assert [BACKOFF.delay_s(n) for n in range(6)] == [600, 1200, 2400, 3600, 3600, 3600]
    assert BACKOFF.delay_s(10_000) == 3600  # no overflow however long the cluster stays full


def test_the_backoff_is_the_operators_setting() -> None:
    assert kube_fit.FitBackoff.of(load_settings(environ={})) == BACKOFF  # 10 minutes, at most an hour
    settings = load_settings(environ={"SLOTUNE_FIT_RETRY_S": "10", "SLOTUNE_FIT_RETRY_MAX_S": "20"})
    assert kube_fit.FitBackoff.of(settings) == kube_fit.FitBackoff(10, 20)
    with pytest.raises(ValueError, match="SLOTUNE_FIT_RETRY_S"):
        load_settings(environ={"SLOTUNE_FIT_RETRY_S": "30", "SLOTUNE_FIT_RETRY_MAX_S": "20"})


def fitted(replicas: int, requested: int, retries: int | None, retry_at: str | None) -> dict:
    """A Deployment at `replicas` of `requested`, with the retry annotations given (None: absent)."""
    found = deployment(replicas, requested, generation=3)
    for key, value in ((kube_fit.RETRIES_ANNOTATION, retries), (kube_fit.RETRY_AT_ANNOTATION, retry_at)):
        if value is not None:
            found["metadata"]["annotations"][key] = str(value)
    return found


def test_a_fit_sets_the_next_retry_from_the_retries_before_it() -> None:
    first = kube_fit.fit(4, [pod(True)] * 2, "exceeded quota", deployment(4, 4, None), BACKOFF, NOW)
    assert (first.retries, first.retry_at_s) == (0, NOW + 600)
    assert "asked for again at 2027-01-15T08:10:00Z (retry 1)" in first.message()
    annotations = kube_fit.fit_patch(first, generation=3)["metadata"]["annotations"]
    assert annotations[kube_fit.RETRY_AT_ANNOTATION] == "2027-01-15T08:10:00Z"
    after_two = kube_fit.fit(4, [pod(True)] * 2, "exceeded quota", fitted(4, 4, 2, None), BACKOFF, NOW)
    assert after_two.retry_at_s == NOW + 2400  # two retries did not fit: 600 s doubled twice
    assert "(retry 3)" in after_two.message()


def test_the_requested_count_is_asked_for_again_once_the_retry_is_due() -> None:
    waiting = fitted(2, 4, 0, "2027-01-15T08:10:00Z")
    assert kube_fit.retry_patch(waiting, 4, NOW + 599) is None
    patch = kube_fit.retry_patch(waiting, 4, NOW + 600)
    assert patch == {"metadata": {"annotations": {kube_fit.FITTED_GENERATION_ANNOTATION: None,
                                                  kube_fit.RETRY_AT_ANNOTATION: None,
                                                  kube_fit.RETRIES_ANNOTATION: "1"}},
                     "spec": {"replicas": 4}}
    assert kube_fit.retry_patch(waiting, 8, NOW + 600) is None  # another request than the one fitted
    assert kube_fit.retry_patch(fitted(4, 4, 0, "2027-01-15T08:00:00Z"), 4, NOW) is None  # it runs the full count
    assert kube_fit.retry_patch(deployment(2, 2, None), 4, NOW) is None  # never fitted: another count asked
    assert kube_fit.retry_patch(deployment(2, 4, generation=3), 4, NOW) is not None  # fitted before retries existed
    assert kube_fit.retry_patch(None, 4, NOW) is None


def test_the_retries_are_forgotten_once_the_full_count_runs() -> None:
    assert kube_fit.reset_patch(fitted(2, 4, 1, "2027-01-15T08:00:00Z")) is None  # still fitted: the backoff goes on
    full = fitted(4, 4, 1, None)
    assert kube_fit.reset_patch(full) == {"metadata": {"annotations": {kube_fit.RETRIES_ANNOTATION: None,
                                                                       kube_fit.RETRY_AT_ANNOTATION: None}}}
    assert kube_fit.reset_patch(deployment(4, 4, None)) is None  # nothing to forget: no write
