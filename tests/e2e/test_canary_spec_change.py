"""A spec change in the middle of a canary: the new generation's loop starts afresh and knows nothing of the old
one's canary, so the update's deploy (slotune.controller.run.deploy with restart_tuning, what the update handler
runs) ends it: the live canary's annotation goes and the new loop's first apply brings the canary pod back to the
running config; an extra canary pod's Deployment is deleted. An operator restarted within one generation (deploy
without restart_tuning, the resume handler's) leaves the canary to the loop that resumes it.

Real control plane, kwok pods, a runtime process per Ready pod (tests/e2e/harness/kubelet.py); every pod's live
config is read back from the pod (GET /admin/config).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from slotune.api import parse_tunedmodel
from slotune.api.resource import TunedModel
from slotune.backends.kube_api import KubeAPI
from slotune.backends.kube_canary import CanaryAssignment
from slotune.backends.kube_canary_pod import canary_deployment_name
from slotune.backends.kube_deployment import KubernetesBackend
from slotune.controller.run import deploy
from slotune.settings import OperatorSettings
from tests.e2e.harness.kube import apply, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.kubelet import KubeletStandIn
from tests.e2e.harness.pods import live_seqs, seqs, settle
from tests.e2e.test_canary_pods import tunedmodel

NAME = "respec"


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "canary-respec") as name:
        yield name


def changed_spec(kube: Any, manifest: dict[str, Any]) -> TunedModel:
    """The TunedModel with a longer window (a new generation that leaves the pod template as it is: an SLO change
    would restart the pods, whose histograms take the targets as bucket edges), as the API server holds it."""
    manifest["spec"]["tuning"] = {**manifest["spec"]["tuning"], "windowSeconds": 7}
    apply(kube, manifest)
    tm = parse_tunedmodel(get(kube, "tunedmodel", NAME, manifest["metadata"]["namespace"]))
    assert (tm.metadata.generation or 0) > 1
    return tm


def test_a_spec_change_mid_canary_brings_the_canary_pod_back_to_the_running_config(kube, operator_kubeconfig, namespace,
                                                                                   prometheus, model_cache,
                                                                                   tmp_path) -> None:
    kubelet = KubeletStandIn(kube.api_client(), namespace, NAME, prometheus(), tmp_path).start()
    settings = OperatorSettings(pod_endpoints_file=kubelet.endpoints_file, rollout_timeout_s=300)
    api = KubeAPI.from_environment(str(operator_kubeconfig))
    manifest = tunedmodel(namespace, NAME)
    try:
        apply(kube, manifest)
        tm = parse_tunedmodel(get(kube, "tunedmodel", NAME, namespace))
        running = deploy(api, tm, settings, restart_tuning=True)
        backend = KubernetesBackend(api, tm, settings)
        wait_for(lambda: len(live_seqs(kubelet)) == 2, 180, "both pods serving", describe=lambda: f"{kubelet.errors}")
        candidate = running.with_changes(max_num_seqs=16)
        assert settle(lambda: backend.start_canary(running, candidate).result).ok  # type: ignore[union-attr]
        assignment = CanaryAssignment.of(backend.deployment())
        assert assignment is not None and assignment.generation == tm.metadata.generation
        assert sorted(seqs(kubelet).values()) == [1, 16]
        restarts = kubelet.started_total

        deploy(api, tm, settings, restart_tuning=False)  # an operator restart: the resumed loop owns the canary
        assert CanaryAssignment.of(backend.deployment()) == assignment

        fresh = changed_spec(kube, manifest)
        deploy(api, fresh, settings, restart_tuning=True)  # the update handler
        again = KubernetesBackend(api, fresh, settings)
        assert CanaryAssignment.of(again.deployment()) is None
        assert settle(lambda: again.apply(fresh.spec.initial_config())).ok  # the new loop's first apply
        assert seqs(kubelet) == dict.fromkeys(kubelet.pods, 1)
        assert kubelet.started_total == restarts  # brought back live, no pod restarted
    finally:
        api.close()
        kubelet.stop()


def test_a_spec_change_mid_canary_deletes_the_extra_canary_pod(kube, operator_kubeconfig, namespace, prometheus,
                                                               model_cache, tmp_path) -> None:
    kubelet = KubeletStandIn(kube.api_client(), namespace, NAME, prometheus(), tmp_path).start()
    settings = OperatorSettings(pod_endpoints_file=kubelet.endpoints_file, rollout_timeout_s=300)
    api = KubeAPI.from_environment(str(operator_kubeconfig))
    # hotReconfigure off: a change needs a restart; maxReplicas 2 leaves room for one extra pod.
    manifest = tunedmodel(namespace, NAME, replicas=1, tuning={
        "mode": "off", "windowSeconds": 5, "minSamples": 10, "hotReconfigure": False,
        "bounds": {"minReplicas": 1, "maxReplicas": 2}})
    try:
        apply(kube, manifest)
        tm = parse_tunedmodel(get(kube, "tunedmodel", NAME, namespace))
        running = deploy(api, tm, settings, restart_tuning=True)
        backend = KubernetesBackend(api, tm, settings)
        wait_for(lambda: len(live_seqs(kubelet)) == 1, 180, "the pod serving", describe=lambda: f"{kubelet.errors}")
        (main,) = live_seqs(kubelet)
        candidate = running.with_changes(max_num_seqs=16)
        assert settle(lambda: backend.start_canary(running, candidate).result).ok  # type: ignore[union-attr]
        wait_for(lambda: sorted(live_seqs(kubelet).values()) == [1, 16], 180, "the extra canary pod serving",
                 describe=lambda: f"{live_seqs(kubelet)} {kubelet.errors}")

        deploy(api, tm, settings, restart_tuning=False)  # an operator restart: the resumed loop owns the canary
        assert get(kube, "deployment", canary_deployment_name(NAME), namespace) is not None

        fresh = changed_spec(kube, manifest)
        deploy(api, fresh, settings, restart_tuning=True)  # the update handler
        wait_for(lambda: get(kube, "deployment", canary_deployment_name(NAME), namespace) is None, 120,
                 "the canary Deployment deleted")
        wait_for(lambda: live_seqs(kubelet) == {main: 1}, 180, "the main pod alone, on the running config",
                 describe=lambda: f"{live_seqs(kubelet)} {kubelet.errors}")
        assert settle(lambda: KubernetesBackend(api, fresh, settings).apply(fresh.spec.initial_config())).ok
        assert live_seqs(kubelet) == {main: 1}
    finally:
        api.close()
        kubelet.stop()
